package nftables_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/internal/kerneltest"
	"github.com/svcproxy/svcproxy/kernelmodes/nftables"
	"github.com/svcproxy/svcproxy/lb"
)

// TestPrivilegedScale programs 1,000 and 10,000 Services × 10 endpoints in
// a namespace and logs the control-plane figures issue 14 sets targets for
// (first load < 1 s at 10,000; an endpoint change and an added Service
// p99 < 10 ms), each until the kernel has committed the transaction. It
// checks the element counts, not the times (timings belong to the bench):
// run it with -v to read them.
func TestPrivilegedScale(t *testing.T) {
	if testing.Short() {
		t.Skip("scale test skipped in -short mode")
	}
	privileged.Require(t)
	for _, n := range []int{1000, 10000} {
		ctx := context.Background()
		ns := privileged.NewNS(t)
		m, err := nftables.New(nftables.Config{NetNS: ns})
		if err != nil {
			t.Fatal(err)
		}
		st := lb.NewStore(lb.StoreOptions{})
		svcs := kerneltest.ScaleServices(n)
		snap := snapshot(t, st, svcs)
		start := time.Now()
		if err := m.Apply(ctx, snap, true); err != nil {
			t.Fatal(err)
		}
		load := time.Since(start)
		elems, err := countElements(ns)
		if err != nil {
			t.Fatal(err)
		}
		addrs := map[netip.Addr]bool{}
		slots := 0
		for _, s := range svcs {
			for _, e := range s.Endpoints {
				addrs[e.Addr.Addr()] = true
			}
			slots += min(len(s.Endpoints), nftables.Slots) + 1
		}
		if want := slots + len(addrs); elems != want { // a slot per endpoint and a slots-map element each, a hairpin element per endpoint address
			t.Errorf("%d Services: %d elements, want %d", n, elems, want)
		}
		var change, add []time.Duration
		for i := range 20 {
			j := (i * 7919) % n
			svcs[j].Endpoints = slices.Clone(svcs[j].Endpoints)
			svcs[j].Endpoints[0].Addr = netip.AddrPortFrom(svcs[j].Endpoints[0].Addr.Addr(), 9000+uint16(i))
			next := snapshot(t, st, svcs)
			start = time.Now()
			if err := m.Apply(ctx, next, false); err != nil {
				t.Fatal(err)
			}
			change = append(change, time.Since(start))
			svcs = append(svcs, kerneltest.ScaleService(n+i))
			next = snapshot(t, st, svcs)
			start = time.Now()
			if err := m.Apply(ctx, next, false); err != nil {
				t.Fatal(err)
			}
			add = append(add, time.Since(start))
		}
		next := snapshot(t, st, svcs)
		start = time.Now()
		if err := m.Apply(ctx, next, true); err != nil { // within the full-sync period: a check
			t.Fatal(err)
		}
		check := time.Since(start)
		t.Logf("%d Services × 10 endpoints: first load %v; endpoint change p50 %v p99 %v; add a Service p50 %v p99 %v; periodic full Apply (check) %v",
			n, load.Round(time.Millisecond), kerneltest.Median(change), p99(change), kerneltest.Median(add), p99(add), check.Round(time.Millisecond))
		if err := m.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func p99(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*99/100)]
}
