package lb

import (
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"
)

var algorithms = []Algorithm{RoundRobin, Random, LeastConn, Maglev}

func TestPickRoundRobinExact(t *testing.T) {
	_, p := testPool(t, RoundRobin, 3, nil)
	got := countPicks(p, 3000, t0)
	checkSpread(t, p, got, 1000, 0)

	// And in turn: any three consecutive picks are three different backends.
	var last []*Backend
	for i := range 30 {
		var tried Tried
		last = append(last, p.Pick(clientAddr(i), &tried, t0))
		if len(last) == 3 {
			if last[0] == last[1] || last[1] == last[2] || last[0] == last[2] {
				t.Fatalf("picks %d-%d = %v, want three different backends", i-2, i, addrs(last))
			}
			last = last[:0]
		}
	}
}

func TestPickSpread(t *testing.T) {
	for _, tc := range []struct {
		algo      Algorithm
		backends  int
		picks     int
		tolerance float64
		acquire   bool // hold every picked connection open
	}{
		{algo: Random, backends: 3, picks: 30000, tolerance: 0.15},
		{algo: LeastConn, backends: 3, picks: 30000, tolerance: 0.15},
		{algo: LeastConn, backends: 3, picks: 3000, tolerance: 0.15, acquire: true},
		{algo: Random, backends: 10, picks: 30000, tolerance: 0.15},
		{algo: LeastConn, backends: 10, picks: 30000, tolerance: 0.15, acquire: true},
		// Maglev picks by client: 10k distinct client IPs.
		{algo: Maglev, backends: 3, picks: 10000, tolerance: 0.10},
		{algo: Maglev, backends: 5, picks: 10000, tolerance: 0.10},
		{algo: Maglev, backends: 10, picks: 10000, tolerance: 0.10},
	} {
		name := tc.algo.String() + "/backends=" + strconv.Itoa(tc.backends)
		if tc.acquire {
			name += "/acquire"
		}
		t.Run(name, func(t *testing.T) {
			_, p := testPool(t, tc.algo, tc.backends, nil)
			got := make(map[netip.AddrPort]int)
			for i := range tc.picks {
				var tried Tried
				b := p.Pick(clientAddr(i), &tried, t0)
				if b == nil {
					t.Fatalf("pick %d: got nil backend", i)
				}
				if tc.acquire {
					b.Acquire()
				}
				got[b.Addr]++
			}
			checkSpread(t, p, got, tc.picks/tc.backends, tc.tolerance)
		})
	}
}

func TestPickLeastConnPrefersIdle(t *testing.T) {
	for _, n := range []int{2, 3, 10} {
		t.Run("backends="+strconv.Itoa(n), func(t *testing.T) {
			_, p := testPool(t, LeastConn, n, nil)
			busy := p.Backends()[1]
			for range 100 {
				busy.Acquire()
			}
			const picks = 3000
			got := countPicks(p, picks, t0)
			if got[busy.Addr] > picks/100 {
				t.Errorf("busy backend (Active %d) picked %d of %d times, want at most %d", busy.Active(), got[busy.Addr], picks, picks/100)
			}
			for range 100 {
				busy.Release()
			}
			if busy.Active() != 0 {
				t.Errorf("after releasing all, Active() = %d, want 0", busy.Active())
			}
		})
	}
}

func TestPickMaglevSameClientSameBackend(t *testing.T) {
	_, p := testPool(t, Maglev, 5, nil)
	// Another node, with the same endpoints listed in another order.
	_, other := testPool(t, Maglev, 5, func(s *Service) { slices.Reverse(s.Endpoints) })
	for i := range 1000 {
		client := clientAddr(i)
		var tried Tried
		want := p.Pick(client, &tried, t0)
		for call := range 5 {
			if got := p.Pick(client, &tried, t0.Add(time.Duration(call)*time.Hour)); got != want {
				t.Fatalf("client %v call %d: got %v, want %v", client, call, got.Addr, want.Addr)
			}
		}
		mapped := netip.AddrFrom16(client.As16())
		if got := p.Pick(mapped, &tried, t0); got != want {
			t.Fatalf("client %v (IPv4-mapped): got %v, want %v as for %v", mapped, got.Addr, want.Addr, client)
		}
		if got := other.Pick(client, &tried, t0); got.Addr != want.Addr {
			t.Fatalf("client %v on another store: got %v, want %v", client, got.Addr, want.Addr)
		}
	}
}

// TestMaglevMinimalDisruption changes a Maglev pool by one backend: only
// the clients of the removed backend (or the clients the added one takes
// over) move; (almost) every other client keeps its backend. Backends are
// compared by address, as the table depends on addresses only.
// The table size is the same for every backend count, so this also holds
// across counts where a size chosen by count would have stepped.
func TestMaglevMinimalDisruption(t *testing.T) {
	const clients = 10000
	for _, tc := range []struct {
		name          string
		before, after int // backends 0..before-1, then 0..after-1 minus removed
		removed       int // index removed, or -1 when one is added
	}{
		{name: "remove 1 of 5", before: 5, after: 5, removed: 2},
		{name: "remove 1 of 4", before: 4, after: 4, removed: 0},
		{name: "remove 1 of 10", before: 10, after: 10, removed: 9},
		{name: "add a 5th", before: 4, after: 5, removed: -1},
		{name: "remove 1 of 3", before: 3, after: 3, removed: 1},
		{name: "remove 1 of 6", before: 6, after: 6, removed: 5},
		{name: "remove 1 of 11", before: 11, after: 11, removed: 3},
		{name: "remove 1 of 41", before: 41, after: 41, removed: 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, p := testPool(t, Maglev, tc.before, nil)
			was := make([]netip.AddrPort, clients)
			for i := range was {
				var tried Tried
				was[i] = p.Pick(clientAddr(i), &tried, t0).Addr
			}

			svc := testService("web", tc.after)
			svc.Algorithm = Maglev
			var gone, added netip.AddrPort
			if tc.removed >= 0 {
				gone = svc.Endpoints[tc.removed].Addr
				svc.Endpoints = slices.Delete(svc.Endpoints, tc.removed, tc.removed+1)
			} else {
				added = svc.Endpoints[tc.after-1].Addr
			}
			p2 := mustUpdate(t, s, svc).Balancer(svc.Name).Internal
			if len(p2.maglev) != len(p.maglev) {
				t.Fatalf("test setup: table size changed from %d to %d", len(p.maglev), len(p2.maglev))
			}

			var affected, others, moved int
			for i := range was {
				var tried Tried
				now := p2.Pick(clientAddr(i), &tried, t0).Addr
				switch {
				case was[i] == gone:
					affected++
					if now == gone {
						t.Fatalf("client %v still goes to removed backend %v", clientAddr(i), gone)
					}
				case now == added:
					affected++
				default:
					others++
					if now != was[i] {
						moved++
					}
				}
			}
			// The changed backend's share is about 1/5 (1/4, 1/10) of the clients.
			if share, want := affected, clients/max(tc.before, tc.after); share < want*8/10 || share > want*12/10 {
				t.Errorf("%d clients were on the removed or went to the added backend, want about %d", share, want)
			}
			// Maglev is near-minimal, not minimal: allow a few percent.
			if limit := others * 5 / 100; moved > limit {
				t.Errorf("%d of %d other clients moved, want at most %d", moved, others, limit)
			}
		})
	}
}

func TestMaglevTable(t *testing.T) {
	for _, n := range []int{1, 2, 3, 10, 100, 1000} {
		t.Run("backends="+strconv.Itoa(n), func(t *testing.T) {
			backends := make([]*Backend, n)
			for i := range backends {
				backends[i] = newBackend(TCP, backendAddr(i), HealthPolicy{})
			}
			table := maglevTable(backends)
			if got, want := len(table), maglevTableSize; got != want {
				t.Fatalf("table size = %d, want %d", got, want)
			}
			shares := make([]int, n)
			for slot, i := range table {
				if int(i) >= n {
					t.Fatalf("slot %d = %d, want a backend index below %d", slot, i, n)
				}
				shares[i]++
			}
			// Backends take turns, so shares differ by at most one.
			lo, hi := slices.Min(shares), slices.Max(shares)
			if hi-lo > 1 {
				t.Errorf("shares range over %d..%d, want within one of %d", lo, hi, len(table)/n)
			}
			if again := maglevTable(backends); !slices.Equal(again, table) {
				t.Errorf("second build differs from the first")
			}
		})
	}
	if got := maglevTable(nil); got != nil {
		t.Errorf("maglevTable(nil) = %v, want nil", got)
	}
}

func TestPickTried(t *testing.T) {
	for _, algo := range algorithms {
		for _, n := range []int{1, 3, 5} {
			t.Run(algo.String()+"/backends="+strconv.Itoa(n), func(t *testing.T) {
				_, p := testPool(t, algo, n, nil)
				client := clientAddr(7)
				var tried Tried
				for attempt := range n {
					b := p.Pick(client, &tried, t0)
					if b == nil {
						t.Fatalf("attempt %d: got nil, want an untried backend", attempt)
					}
					if tried.Has(b) {
						t.Fatalf("attempt %d: got %v, which was tried already", attempt, b.Addr)
					}
					tried.Add(b)
				}
				if got := tried.Len(); got != n {
					t.Errorf("Len() = %d, want %d", got, n)
				}
				if b := p.Pick(client, &tried, t0); b != nil {
					t.Errorf("all tried: got %v, want nil", b.Addr)
				}
			})
		}
	}
}

func TestTriedBounded(t *testing.T) {
	var tried Tried
	bs := make([]*Backend, MaxAttempts+2)
	for i := range bs {
		bs[i] = newBackend(TCP, backendAddr(i), HealthPolicy{})
		tried.Add(bs[i])
	}
	if got := tried.Len(); got != MaxAttempts {
		t.Errorf("Len() = %d, want %d", got, MaxAttempts)
	}
	if !tried.Has(bs[MaxAttempts-1]) || tried.Has(bs[MaxAttempts]) {
		t.Errorf("Has(last kept) = %v, Has(first dropped) = %v; want true, false", tried.Has(bs[MaxAttempts-1]), tried.Has(bs[MaxAttempts]))
	}
}

func TestPickEmptyPool(t *testing.T) {
	for _, algo := range algorithms {
		t.Run(algo.String(), func(t *testing.T) {
			_, p := testPool(t, algo, 0, func(s *Service) { s.AffinityTimeout = time.Hour })
			var tried Tried
			if b := p.Pick(clientAddr(1), &tried, t0); b != nil {
				t.Errorf("got %v, want nil", b.Addr)
			}
		})
	}
}

func TestHealthCoolDown(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy HealthPolicy
		want   []time.Duration // cool-down after the 1st, 2nd, … consecutive failure; 0: none
	}{
		{
			name:   "defaults",
			policy: HealthPolicy{},
			want:   []time.Duration{1 * time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second},
		},
		{
			name:   "capped",
			policy: HealthPolicy{Base: time.Second, Max: 5 * time.Second},
			want:   []time.Duration{1 * time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second},
		},
		{
			name:   "max below base is base",
			policy: HealthPolicy{Base: 3 * time.Second, Max: time.Second},
			want:   []time.Duration{3 * time.Second, 3 * time.Second},
		},
		{
			name:   "negative base disables",
			policy: HealthPolicy{Base: -1},
			want:   []time.Duration{0, 0, 0},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Backends get the Store's policy.
			s := newTestStore(StoreOptions{Health: tc.policy})
			b := mustUpdate(t, s, testService("web", 1)).Balancer(nameOf("web")).Internal.Backends()[0]
			now := t0
			for i, want := range tc.want {
				b.ReportFailure(now)
				got := coolDown(b, now)
				if got != want {
					t.Errorf("failure %d: cool-down = %v, want %v", i+1, got, want)
				}
				wantFailures := uint32(i + 1)
				if want == 0 {
					wantFailures = 0
				}
				if b.Failures() != wantFailures {
					t.Errorf("failure %d: Failures() = %d, want %d", i+1, b.Failures(), wantFailures)
				}
				now = now.Add(time.Minute) // failures are consecutive, not concurrent
			}
			b.ReportSuccess()
			if b.Failures() != 0 || b.CoolingDown(now) {
				t.Errorf("after ReportSuccess: Failures() = %d, CoolingDown = %v; want 0, false", b.Failures(), b.CoolingDown(now))
			}
			b.ReportFailure(now)
			if got := coolDown(b, now); got != tc.want[0] {
				t.Errorf("first failure after success: cool-down = %v, want %v", got, tc.want[0])
			}
		})
	}
}

// coolDown is how long after now b stays cooling down: the d for which
// CoolingDown is true up to now+d-1ns and false from now+d on, or -1 if
// there is no such d of whole nanoseconds up to an hour.
func coolDown(b *Backend, now time.Time) time.Duration {
	if !b.CoolingDown(now) {
		return 0
	}
	lo, hi := time.Duration(0), time.Hour // cooling at now+lo, not at now+hi
	if b.CoolingDown(now.Add(hi)) {
		return -1
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if b.CoolingDown(now.Add(mid)) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}

func TestPickSkipsCoolingBackend(t *testing.T) {
	for _, algo := range algorithms {
		t.Run(algo.String(), func(t *testing.T) {
			_, p := testPool(t, algo, 3, nil)
			sick := p.Backends()[1]
			sick.ReportFailure(t0)

			during := t0.Add(999 * time.Millisecond)
			if got := countPicks(p, 3000, during); got[sick.Addr] != 0 {
				t.Errorf("during cool-down: sick backend picked %d times, want 0 (picks %v)", got[sick.Addr], got)
			}
			after := t0.Add(time.Second)
			if got := countPicks(p, 3000, after); got[sick.Addr] == 0 {
				t.Errorf("after cool-down: sick backend never picked, want it back (picks %v)", got)
			}
			// A second failure cools it for twice as long.
			sick.ReportFailure(after)
			if got := countPicks(p, 3000, after.Add(1999*time.Millisecond)); got[sick.Addr] != 0 {
				t.Errorf("during second cool-down: sick backend picked %d times, want 0", got[sick.Addr])
			}
			sick.ReportSuccess()
			if got := countPicks(p, 3000, after); got[sick.Addr] == 0 {
				t.Errorf("after ReportSuccess: sick backend never picked, want it back (picks %v)", got)
			}
		})
	}
}

func TestPickAllCoolingStillPicks(t *testing.T) {
	for _, algo := range algorithms {
		t.Run(algo.String(), func(t *testing.T) {
			_, p := testPool(t, algo, 3, nil)
			for _, b := range p.Backends() {
				b.ReportFailure(t0)
			}
			now := t0.Add(100 * time.Millisecond)
			got := countPicks(p, 300, now)
			if got[netip.AddrPort{}] != 0 {
				t.Errorf("every backend cooling down: Pick returned nil %d times, want never", got[netip.AddrPort{}])
			}
			// Retries still go to untried backends, then stop.
			var tried Tried
			for attempt := range 3 {
				b := p.Pick(clientAddr(1), &tried, now)
				if b == nil || tried.Has(b) {
					t.Fatalf("attempt %d: got %v, want an untried backend", attempt, b)
				}
				tried.Add(b)
			}
			if b := p.Pick(clientAddr(1), &tried, now); b != nil {
				t.Errorf("all tried: got %v, want nil", b.Addr)
			}
		})
	}
}

// TestPickPrefersHealthyWhenSomeCool: with only one healthy backend left,
// every first attempt goes to it.
func TestPickPrefersHealthyWhenSomeCool(t *testing.T) {
	for _, algo := range algorithms {
		t.Run(algo.String(), func(t *testing.T) {
			_, p := testPool(t, algo, 5, nil)
			healthy := p.Backends()[3]
			for _, b := range p.Backends() {
				if b != healthy {
					b.ReportFailure(t0)
				}
			}
			got := countPicks(p, 1000, t0)
			if got[healthy.Addr] != 1000 {
				t.Errorf("picks = %v, want all 1000 on %v", got, healthy.Addr)
			}
		})
	}
}

func affinityPool(t *testing.T, algo Algorithm, n int) (*Store, *Pool) {
	t.Helper()
	return testPool(t, algo, n, func(s *Service) { s.AffinityTimeout = time.Hour })
}

func TestAffinitySticks(t *testing.T) {
	for _, algo := range algorithms {
		t.Run(algo.String(), func(t *testing.T) {
			_, p := affinityPool(t, algo, 5)
			for c := range 50 {
				client := clientAddr(c)
				var tried Tried
				first := p.Pick(client, &tried, t0)
				now := t0
				for i := range 20 {
					// Each use is within the timeout of the last: it never expires.
					now = now.Add(59 * time.Minute)
					if got := p.Pick(client, &tried, now); got != first {
						t.Fatalf("client %v pick %d at +%v: got %v, want %v", client, i, now.Sub(t0), got.Addr, first.Addr)
					}
				}
			}
		})
	}
}

func TestAffinityRoundRobinStillSpreadsClients(t *testing.T) {
	_, p := affinityPool(t, RoundRobin, 3)
	got := countPicks(p, 3000, t0) // 3000 distinct clients
	checkSpread(t, p, got, 1000, 0)
}

func TestAffinityExpires(t *testing.T) {
	_, p := affinityPool(t, RoundRobin, 3)
	client := clientAddr(1)
	var tried Tried
	first := p.Pick(client, &tried, t0)
	// Exactly the timeout after the last use still counts as active.
	if got := p.Pick(client, &tried, t0.Add(time.Hour)); got != first {
		t.Fatalf("at the timeout: got %v, want %v", got.Addr, first.Addr)
	}
	later := t0.Add(time.Hour).Add(time.Hour + time.Nanosecond)
	got := p.Pick(client, &tried, later)
	i := slices.Index(p.Backends(), first)
	if want := p.Backends()[(i+1)%3]; got != want {
		t.Fatalf("after the timeout: got %v, want the next in turn %v (was %v)", got.Addr, want.Addr, first.Addr)
	}
	// And the new choice sticks.
	if again := p.Pick(client, &tried, later.Add(time.Minute)); again != got {
		t.Errorf("after re-pinning: got %v, want %v", again.Addr, got.Addr)
	}
}

func TestAffinityBypassedByRetry(t *testing.T) {
	for _, algo := range algorithms {
		t.Run(algo.String(), func(t *testing.T) {
			_, p := affinityPool(t, algo, 3)
			client := clientAddr(1)
			var first Tried
			pinned := p.Pick(client, &first, t0)

			var tried Tried
			tried.Add(pinned)
			retry := p.Pick(client, &tried, t0)
			if retry == nil || retry == pinned {
				t.Fatalf("retry after %v: got %v, want another backend", pinned.Addr, retry)
			}
			// The backend that answered the retry is the client's now.
			var fresh Tried
			if got := p.Pick(client, &fresh, t0.Add(time.Second)); got != retry {
				t.Errorf("first attempt after the retry: got %v, want %v", got.Addr, retry.Addr)
			}
		})
	}
}

func TestAffinityBypassesCoolingBackend(t *testing.T) {
	for _, algo := range algorithms {
		t.Run(algo.String(), func(t *testing.T) {
			_, p := affinityPool(t, algo, 3)
			client := clientAddr(1)
			var tried Tried
			pinned := p.Pick(client, &tried, t0)
			pinned.ReportFailure(t0)
			got := p.Pick(client, &tried, t0.Add(time.Millisecond))
			if got == nil || got == pinned {
				t.Fatalf("pinned backend %v cooling down: got %v, want another backend", pinned.Addr, got)
			}
		})
	}
}

func TestAffinityToRemovedBackendIgnored(t *testing.T) {
	for _, algo := range algorithms {
		t.Run(algo.String(), func(t *testing.T) {
			mod := func(s *Service) { s.AffinityTimeout = time.Hour; s.Algorithm = algo }
			s, p := testPool(t, algo, 3, mod)
			// Pin many clients, so some are on every backend.
			pinned := make(map[netip.Addr]*Backend)
			for c := range 30 {
				var tried Tried
				pinned[clientAddr(c)] = p.Pick(clientAddr(c), &tried, t0)
			}
			gone := pinned[clientAddr(0)]

			svc := testService("web", 3)
			mod(&svc)
			svc.Endpoints = slices.DeleteFunc(svc.Endpoints, func(ep Endpoint) bool { return ep.Addr == gone.Addr })
			p = mustUpdate(t, s, svc).Balancer(svc.Name).Internal

			for client, was := range pinned {
				var tried Tried
				got := p.Pick(client, &tried, t0.Add(time.Minute))
				if got == nil || !slices.Contains(p.Backends(), got) {
					t.Fatalf("client %v: got %v, want a backend of the new pool %v", client, got, addrs(p.Backends()))
				}
				if was != gone && got != was {
					t.Errorf("client %v: got %v, want it to keep %v", client, got.Addr, was.Addr)
				}
			}
		})
	}
}

func TestPickAllocs(t *testing.T) {
	for _, algo := range algorithms {
		t.Run(algo.String(), func(t *testing.T) {
			_, p := testPool(t, algo, 10, nil)
			client := clientAddr(1)
			first := testing.AllocsPerRun(1000, func() {
				var tried Tried
				p.Pick(client, &tried, t0)
			})
			var tried Tried
			tried.Add(p.Backends()[0])
			tried.Add(p.Backends()[5])
			retry := testing.AllocsPerRun(1000, func() {
				p.Pick(client, &tried, t0)
			})
			if first != 0 || retry != 0 {
				t.Errorf("allocations per Pick: first attempt %v, retry %v; want 0, 0", first, retry)
			}
		})
	}
}

// TestAffinityTableBounded: entries of clients gone quiet are swept, so the
// table holds about the recently active clients, not every client ever seen.
func TestAffinityTableBounded(t *testing.T) {
	_, p := affinityPool(t, RoundRobin, 3)
	const clients = 2000
	for i := range clients {
		var tried Tried
		p.Pick(clientAddr(i), &tried, t0)
	}
	later := t0.Add(2 * time.Hour) // every entry above has expired
	for i := range clients {
		var tried Tried
		p.Pick(clientAddr(clients+i), &tried, later)
	}
	tab := &p.rt.affinity
	tab.mu.Lock()
	defer tab.mu.Unlock()
	stale := 0
	for _, e := range tab.m {
		if later.Sub(e.lastUsed) > time.Hour {
			stale++
		}
	}
	if stale != 0 || len(tab.m) > 2*clients {
		t.Errorf("affinity table holds %d entries, %d of them expired; want at most %d, none expired", len(tab.m), stale, 2*clients)
	}
}
