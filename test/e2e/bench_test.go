package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/svcproxy/svcproxy/forwarder"
	"github.com/svcproxy/svcproxy/internal/proctest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/redirect"
)

// benchServices is the namespace the benchmark's Services live in, and how
// many exist so far: sizes grow (1,000 then 10,000) without recreating.
var benchServices struct {
	mu sync.Mutex
	ns string
	n  int
}

// ensureServices makes n Services (one TCP port, one EndpointSlice with
// two ready endpoints each) exist in the benchmark namespace.
func ensureServices(b *testing.B, n int) string {
	b.Helper()
	srv := server(b)
	benchServices.mu.Lock()
	defer benchServices.mu.Unlock()
	ctx := context.Background()
	if benchServices.ns == "" {
		// Not namespace(): its cleanup would run after each sub-benchmark
		// run, and the next reuses the Services. They go with the API
		// server at exit.
		benchServices.ns = "bench"
		if _, err := srv.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	ns := benchServices.ns
	if benchServices.n >= n {
		return ns
	}
	start := time.Now()
	from := benchServices.n
	errs := proctest.Parallel(n-from, 24, func(k int) error {
		i := from + k
		name := fmt.Sprintf("svc-%05d", i)
		s := service(ns, name, "", 80) // ClusterIP allocated by the API server
		if _, err := srv.Client.CoreV1().Services(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return err
		}
		es := endpointSlice(ns, name, name+"-1", 8080, ready(benchIP(i, 0)), ready(benchIP(i, 1)))
		_, err := srv.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{})
		return err
	})
	if len(errs) > 0 {
		b.Fatalf("creating Services: %v", errs[0])
	}
	benchServices.n = n
	b.Logf("created Services %d-%d and their slices in %v", from, n-1, time.Since(start).Round(time.Millisecond))
	return ns
}

// benchIP is a backend address for Service i, variant v.
func benchIP(i, v int) string {
	a := netip.MustParseAddr("10.128.0.0").As4()
	x := i*4 + v
	a[1] += byte(x >> 16)
	a[2] = byte(x >> 8)
	a[3] = byte(x)
	return netip.AddrFrom4(a).String()
}

// BenchmarkWatchToProgrammed measures, with 1,000 and 10,000 Services in a
// real API server, the time from an EndpointSlice update (the Update call)
// to (a) the lb.Store snapshot holding the new endpoint and (b) the
// userspace mode having applied that snapshot: the forwarder and, when
// root with iptables and ipset, the REDIRECT steering (in the private
// network namespace). MinSyncPeriod is 0, so the figures are the
// pipeline's own latency, not a coalescing wait. Run with a fixed count:
//
//	go test -run '^$' -bench WatchToProgrammed -benchtime 50x -timeout 30m ./e2e
//
// Reported per op: store-p50-ms, store-p99-ms, programmed-p50-ms,
// programmed-p99-ms, and initial-sync-s (source start to the first
// snapshot holding every Service).
func BenchmarkWatchToProgrammed(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) { benchWatchToProgrammed(b, n) })
	}
}

func benchWatchToProgrammed(b *testing.B, n int) {
	ns := ensureServices(b, n)
	srv := server(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The userspace mode: forwarder (REDIRECT target only: no frontend
	// sockets) and, where possible, REDIRECT steering on the backend
	// svcproxy would choose: nftables (no tools needed), else iptables +
	// ipset.
	var red *redirect.Redirector
	nft := func() bool {
		kind, err := redirect.Available(ctx, redirect.Config{Mark: forwarder.DefaultMark})
		return err == nil && kind == redirect.BackendNFTables
	}
	if private && (nft() || haveTools("iptables", "iptables-restore", "ipset")) {
		r, err := redirect.New(redirect.Config{Mark: forwarder.DefaultMark})
		if err != nil {
			b.Fatal(err)
		}
		red = r
		defer func() { _ = red.Cleanup(context.Background()) }()
	}
	fwd, err := forwarder.New(forwarder.Config{Redirect: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:0")}, Mark: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = fwd.Shutdown(context.Background()) }()

	start := time.Now()
	p := startPipeline(b, pipelineOptions{client: srv.Client, logger: zap.NewNop()})
	defer p.stop()
	var mu sync.Mutex
	applied := map[uint64]time.Time{} // snapshot version → when programmed
	var appliedMax uint64
	cond := sync.NewCond(&mu)
	updates := p.store.Subscribe()
	full := true
	go func() {
		for {
			snap := p.store.Snapshot()
			_ = fwd.Apply(ctx, snap)
			if red != nil {
				ports := redirect.Ports{TCP: fwd.RedirectAddrs()[0].Port(), UDP: fwd.UDPPorts()}
				if err := red.Apply(ctx, snap, ports, full); err != nil && ctx.Err() == nil {
					b.Errorf("steering: %v", err)
				}
				full = false
			}
			mu.Lock()
			applied[snap.Version] = time.Now()
			appliedMax = snap.Version
			cond.Broadcast()
			mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-updates:
			}
		}
	}()
	p.waitStore(b, "every Service", 10*time.Minute, func(s *lb.Snapshot) bool { return countNS(s, ns) >= n })
	initial := time.Since(start)

	var storeLat, progLat []time.Duration
	published := p.store.Subscribe()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		j := (i * 7919) % n
		name := fmt.Sprintf("svc-%05d", j)
		es, err := srv.Client.DiscoveryV1().EndpointSlices(ns).Get(ctx, name+"-1", metav1.GetOptions{})
		if err != nil {
			b.Fatal(err)
		}
		newIP := benchIP(j, 2+i%2)
		if es.Endpoints[0].Addresses[0] == newIP {
			newIP = benchIP(j, 2+(i+1)%2)
		}
		es.Endpoints[0].Addresses = []string{newIP}
		want := netip.AddrPortFrom(netip.MustParseAddr(newIP), 8080)
		key := lb.ServicePortName{Namespace: ns, Name: name, Port: "http"}

		select { // forget publishes before the update
		case <-published:
		default:
		}
		t0 := time.Now()
		if _, err := srv.Client.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		var snap *lb.Snapshot
		for snap == nil {
			select {
			case <-published:
			case <-time.After(time.Minute):
				b.Fatalf("update %d: not in the store within a minute", i)
			}
			if s := p.store.Snapshot(); s.HasEndpoint(key, want) {
				snap = s
			}
		}
		storeLat = append(storeLat, time.Since(t0))
		mu.Lock()
		for appliedMax < snap.Version {
			cond.Wait()
		}
		var at time.Time
		for v, when := range applied {
			if v >= snap.Version && (at.IsZero() || when.Before(at)) {
				at = when
			}
		}
		clear(applied)
		mu.Unlock()
		progLat = append(progLat, at.Sub(t0))
	}
	b.StopTimer()
	report := func(name string, d []time.Duration) {
		slices.Sort(d)
		b.ReportMetric(float64(d[len(d)/2])/1e6, name+"-p50-ms")
		b.ReportMetric(float64(d[(len(d)*99)/100])/1e6, name+"-p99-ms")
	}
	report("store", storeLat)
	report("programmed", progLat)
	b.ReportMetric(initial.Seconds(), "initial-sync-s")
	mode := "forwarder only"
	if red != nil {
		mode = "forwarder + REDIRECT steering with " + red.Describe()
	}
	b.Logf("%d Services, %s: initial sync %v", n, mode, initial.Round(time.Millisecond))
}

func countNS(s *lb.Snapshot, ns string) int {
	c := 0
	for _, b := range s.Balancers() {
		if b.Service.Name.Namespace == ns {
			c++
		}
	}
	return c
}

func haveTools(tools ...string) bool {
	for _, t := range tools {
		if _, err := exec.LookPath(t); err != nil {
			return false
		}
	}
	return true
}
