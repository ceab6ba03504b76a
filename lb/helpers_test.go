package lb

import (
	"net/netip"
	"testing"
	"time"
)

// t0 is the fixed clock every test starts from; nothing in these tests sleeps.
var t0 = time.Unix(1_700_000_000, 0)

func fixedClock() func() time.Time { return func() time.Time { return t0 } }

// nameOf is the ServicePortName of a test Service called name in "default".
func nameOf(name string) ServicePortName {
	return ServicePortName{Namespace: "default", Name: name, Port: "http"}
}

// backendAddr is the address of the i-th test backend (i from 0).
func backendAddr(i int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 8080)
}

// readyEndpoints returns n ready endpoints at backendAddr(0..n-1).
func readyEndpoints(n int) []Endpoint {
	eps := make([]Endpoint, n)
	for i := range eps {
		eps[i] = Endpoint{Addr: backendAddr(i), Ready: true, Serving: true}
	}
	return eps
}

// clusterIP is the ClusterIP of the i-th test Service (i from 0).
func clusterIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
}

// clientAddr is the i-th of many distinct client IPs.
func clientAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{172, 16 + byte(i>>16), byte(i >> 8), byte(i)})
}

// testService is a valid TCP Service on port 80 of ClusterIP 10.96.0.1 with
// n ready endpoints.
func testService(name string, n int) Service {
	return Service{
		Name:       nameOf(name),
		Port:       80,
		ClusterIPs: []netip.Addr{clusterIP(1)},
		Endpoints:  readyEndpoints(n),
	}
}

// newTestStore returns a Store on the fixed clock.
func newTestStore(opts StoreOptions) *Store {
	if opts.Now == nil {
		opts.Now = fixedClock()
	}
	return NewStore(opts)
}

// mustUpdate applies upserts and fails the test on any error.
func mustUpdate(t testing.TB, s *Store, upserts ...Service) *Snapshot {
	t.Helper()
	snap, err := s.Update(upserts, nil)
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	return snap
}

// testPool stores a Service named "web" with n ready endpoints and the given
// algorithm, after mod (if any) adjusts it, and returns the store and the
// Service's internal pool.
func testPool(t testing.TB, algo Algorithm, n int, mod func(*Service)) (*Store, *Pool) {
	t.Helper()
	s := newTestStore(StoreOptions{})
	svc := testService("web", n)
	svc.Algorithm = algo
	if mod != nil {
		mod(&svc)
	}
	snap := mustUpdate(t, s, svc)
	return s, snap.Balancer(svc.Name).Internal
}

// addrs lists the addresses of backends, for got/want messages.
func addrs(bs []*Backend) []netip.AddrPort {
	out := make([]netip.AddrPort, len(bs))
	for i, b := range bs {
		out[i] = b.Addr
	}
	return out
}

// epAddrs lists the addresses of eps.
func epAddrs(eps []Endpoint) []string {
	out := make([]string, 0, len(eps))
	for _, ep := range eps {
		out = append(out, ep.Addr.String())
	}
	return out
}

// countPicks picks n times (first attempts, from n distinct clients unless
// sameClient) and counts picks per backend address.
func countPicks(p *Pool, n int, now time.Time) map[netip.AddrPort]int {
	got := make(map[netip.AddrPort]int)
	for i := range n {
		var tried Tried
		b := p.Pick(clientAddr(i), &tried, now)
		if b == nil {
			got[netip.AddrPort{}]++
			continue
		}
		got[b.Addr]++
	}
	return got
}

// checkSpread fails unless every backend of p got want picks ± tolerance
// (a fraction of want) and nothing else was picked.
func checkSpread(t *testing.T, p *Pool, got map[netip.AddrPort]int, want int, tolerance float64) {
	t.Helper()
	if len(got) != len(p.Backends()) {
		t.Errorf("picked %d distinct backends %v, want all %d", len(got), got, len(p.Backends()))
	}
	lo, hi := float64(want)*(1-tolerance), float64(want)*(1+tolerance)
	for _, b := range p.Backends() {
		if n := got[b.Addr]; float64(n) < lo || float64(n) > hi {
			t.Errorf("backend %v picked %d times, want %d ± %.0f%%", b.Addr, n, want, tolerance*100)
		}
	}
}
