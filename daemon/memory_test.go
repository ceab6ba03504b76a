package daemon

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/lb"
)

func TestMemoryReturner(t *testing.T) {
	cases := []struct {
		name    string
		samples []int
		frees   int
	}{
		{"steady load never frees", []int{5000, 5100, 4900, 5000, 3000}, 0},
		{"a spike that ended frees once", []int{100, 20000, 20010, 40, 40, 40}, 1},
		{"a small high is no spike", []int{100, 1500, 10, 10}, 0},
		{"exactly half is not under half", []int{4000, 2000}, 0},
		{"each new spike frees again", []int{10000, 100, 100, 8000, 8000, 50}, 2},
		{"a spike falling in steps frees once per halving, down to rest", []int{16000, 7000, 5000, 3000, 1000, 10, 10}, 4},
		{"at rest after a spike, small wobbles free nothing", []int{10000, 40, 300, 100, 1000, 400}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newMemoryReturner(prometheus.NewRegistry(), zap.NewNop(), nil)
			frees := 0
			r.free = func() { frees++ }
			var st returnState
			for _, s := range c.samples {
				r.count = func() int { return s }
				r.step(&st)
			}
			if frees != c.frees {
				t.Errorf("freed %d times, want %d", frees, c.frees)
			}
		})
	}
}

// sizedSnapshot returns a snapshot of services Service ports with no
// endpoints: a configuration of that size.
func sizedSnapshot(t *testing.T, services int) *lb.Snapshot {
	t.Helper()
	store := lb.NewStore(lb.StoreOptions{})
	svcs := make([]lb.Service, services)
	for i := range svcs {
		svcs[i] = lb.Service{Name: lb.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%d", i)}, Protocol: lb.TCP, Port: 80,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})}}
	}
	snap, err := store.Replace(svcs)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// TestMemoryReturnerConfigShrink: a large configuration that shrinks to
// under half returns memory once, whenever the samples fall; small or
// steady configurations never do, and an oscillating one at most once a
// configGap.
func TestMemoryReturnerConfigShrink(t *testing.T) {
	snaps := map[int]*lb.Snapshot{}
	for _, n := range []int{10, 1000, 2500, 3000, 5000, 6000, 10000, 20000} {
		snaps[n] = sizedSnapshot(t, n)
	}
	// Each tick: the sizes applied since the last sample, then a sample
	// 10 s after the last.
	cases := []struct {
		name  string
		ticks [][]int
		frees int
	}{
		{"a large configuration shrinking frees once", [][]int{{10}, {20000}, {20000}, {10}, {10}, {10}}, 1},
		{"grown and shrunk between two samples frees too", [][]int{{10}, {20000, 10}, {10}}, 1},
		{"a small configuration shrinking frees nothing", [][]int{{3000}, {10}, {10}}, 0},
		{"exactly half is not under half", [][]int{{10000}, {5000}, {5000}}, 0},
		{"steady and growing configurations free nothing", [][]int{{6000}, {6000}, {10000}, {20000}, {20000}}, 0},
		// 20,000 → 6,000 frees at once, 6,000 → 2,500 a minute later;
		// then the configuration is small, and 2,500 → 10 frees nothing.
		{"falling in steps frees once per halving while large, at most once a minute", [][]int{{20000}, {6000}, {2500}, {2500}, {2500}, {2500}, {2500}, {2500}, {10}, {10}}, 2},
		// Shrinking every other sample for 130 s: at 20 s, 80 s and 140 s.
		{"oscillating frees at most once a minute", [][]int{{20000}, {1000}, {20000}, {1000}, {20000}, {1000}, {20000}, {1000}, {20000}, {1000}, {20000}, {1000}, {20000}, {1000}}, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newMemoryReturner(prometheus.NewRegistry(), zap.NewNop(), nil)
			frees := 0
			r.free = func() { frees++ }
			r.count = func() int { return 30 } // no load spike
			now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			r.now = func() time.Time { return now }
			var st returnState
			for _, applied := range c.ticks {
				for _, n := range applied {
					r.Applied(snaps[n])
				}
				now = now.Add(r.every)
				r.step(&st)
			}
			if frees != c.frees {
				t.Errorf("freed %d times, want %d", frees, c.frees)
			}
		})
	}
}

func TestSetOOMScoreAdj(t *testing.T) {
	path := filepath.Join(t.TempDir(), "oom_score_adj")
	if err := os.WriteFile(path, []byte("0"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := SetOOMScoreAdj(path, nil); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "0" {
		t.Errorf("unset: file %q, want it untouched", b)
	}
	adj := -999
	if err := SetOOMScoreAdj(path, &adj); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "-999" {
		t.Errorf("file %q, want -999", b)
	}
	if err := SetOOMScoreAdj(filepath.Join(t.TempDir(), "no", "such"), &adj); err == nil || !strings.Contains(err.Error(), "oom_score_adj") {
		t.Errorf("missing file: %v", err)
	}
}
