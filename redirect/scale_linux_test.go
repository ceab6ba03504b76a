//go:build linux

package redirect

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/internal/kerneltest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/redirect/steertable"
)

type scaleFigures struct {
	scratch, resync, add, remove time.Duration
	p99                          time.Duration // of adds and removes together
}

// measureScale programs n Services from scratch into a new namespace, then
// adds and removes one Service rounds times each, and returns the times
// (medians for add and remove).
func measureScale(t testing.TB, backend Backend, variant string, n, rounds int) scaleFigures {
	ctx := context.Background()
	ns := privileged.NewNS(t)
	r, err := New(Config{Backend: backend, NetNS: ns, Mark: testMark, Exec: &netfilter.Exec{NetNS: ns, Variant: variant}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	svcs := kerneltest.ScaleServices(n)
	st := lb.NewStore(lb.StoreOptions{})
	snap, err := st.Replace(svcs)
	if err != nil {
		t.Fatal(err)
	}
	ports := Ports{TCP: testTCPPort}
	var f scaleFigures
	start := time.Now()
	mustApply(t, r, snap, ports, true)
	f.scratch = time.Since(start)
	start = time.Now()
	mustApply(t, r, snap, ports, true)
	f.resync = time.Since(start)
	if backend == BackendNFTables {
		if es, err := r.nk.Elements(ctx, netfilter.IPv4, steertable.SetFrontends); err != nil || len(es) != n {
			t.Fatalf("the frontends map has %d elements (%v), want %d", len(es), err, n)
		}
	} else if members, err := r.exec.IPSetList(ctx, "svcproxy-svc-v4"); err != nil || len(members) != n {
		t.Fatalf("svcproxy-svc-v4 has %d members (%v), want %d", len(members), err, n)
	}
	var adds, removes, all []time.Duration
	for i := range rounds {
		extra := kerneltest.ScaleService(n + i)
		snap, err := st.Update([]lb.Service{extra}, nil)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		mustApply(t, r, snap, ports, false)
		adds = append(adds, time.Since(start))
		all = append(all, time.Since(start))
		snap, err = st.Update(nil, []lb.ServicePortName{extra.Name})
		if err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		mustApply(t, r, snap, ports, false)
		removes = append(removes, time.Since(start))
		all = append(all, time.Since(start))
	}
	f.add, f.remove = kerneltest.Median(adds), kerneltest.Median(removes)
	slices.Sort(all)
	f.p99 = all[(len(all)*99+99)/100-1]
	if r.Repairs() != 0 {
		t.Errorf("Repairs = %d", r.Repairs())
	}
	if err := r.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestPrivilegedScale logs how long programming 1,000 and 10,000 Services
// takes, and one Service added or removed at that scale (median of 20).
// Targets: under 1 s from scratch at 10,000, under 20 ms per change.
func TestPrivilegedScale(t *testing.T) {
	if testing.Short() {
		t.Skip("scale test skipped in -short mode")
	}
	privileged.Require(t)
	type run struct {
		name    string
		backend Backend
		variant string
	}
	runs := []run{{"nftables", BackendNFTables, ""}}
	for _, variant := range kerneltest.Variants() {
		runs = append(runs, run{"iptables-" + kerneltest.VariantName(variant), BackendIPTables, variant})
	}
	for _, rn := range runs {
		for _, n := range []int{1000, 10000} {
			t.Run(fmt.Sprintf("%s/services=%d", rn.name, n), func(t *testing.T) {
				f := measureScale(t, rn.backend, rn.variant, n, 50)
				t.Logf("backend %s, %d Services x (1 ClusterIP, 10 endpoints): from scratch %s, full resync %s, "+
					"add one %s, remove one %s (medians of 50), change p99 %s (targets: scratch < 1 s at 10,000, change < 20 ms; nftables change p99 < 10 ms)",
					rn.name, n, kerneltest.Ms(f.scratch), kerneltest.Ms(f.resync), kerneltest.Ms(f.add), kerneltest.Ms(f.remove), kerneltest.Ms(f.p99))
			})
		}
	}
}

// BenchmarkPrivilegedApply measures one Service added or removed
// (alternately) at each size; from-scratch-ms reports the first full sync.
func BenchmarkPrivilegedApply(b *testing.B) {
	privileged.Require(b)
	for _, n := range []int{10, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			ns := privileged.NewNS(b)
			r, err := New(Config{Backend: BackendIPTables, NetNS: ns, Mark: testMark, Exec: netfilter.NewExec(ns), Logger: zap.NewNop()})
			if err != nil {
				b.Fatal(err)
			}
			svcs := kerneltest.ScaleServices(n)
			st := lb.NewStore(lb.StoreOptions{})
			snap, _ := st.Replace(svcs)
			ports := Ports{TCP: testTCPPort}
			start := time.Now()
			mustApply(b, r, snap, ports, true)
			scratch := time.Since(start)
			extra := kerneltest.ScaleService(n)
			added, _ := st.Update([]lb.Service{extra}, nil)
			removed, _ := st.Update(nil, []lb.ServicePortName{extra.Name})
			i := 0
			for b.Loop() {
				s := added
				if i%2 == 1 {
					s = removed
				}
				i++
				mustApply(b, r, s, ports, false)
			}
			b.StopTimer()
			b.ReportMetric(float64(scratch.Microseconds())/1000, "from-scratch-ms")
			if err := r.Cleanup(context.Background()); err != nil {
				b.Fatal(err)
			}
		})
	}
}
