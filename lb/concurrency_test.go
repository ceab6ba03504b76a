package lb

import (
	"net/netip"
	"sync"
	"testing"
	"time"
)

// TestConcurrentPickAndUpdate runs the hot path (Route, Pick with retries,
// Acquire/Release, passive health) on many goroutines while a writer keeps
// publishing snapshots. Run it with -race. Afterwards every connection
// counter must be back to zero: runtime state survives the Updates intact.
func TestConcurrentPickAndUpdate(t *testing.T) {
	const (
		services = 12
		readers  = 16
		updates  = 200
	)
	iterations := 3000
	if testing.Short() {
		iterations = 300
	}
	variant := func(i, gen int) Service {
		svc := testService("svc"+string(rune('a'+i)), 0)
		svc.ClusterIPs = []netip.Addr{clusterIP(i)}
		svc.NodePort = uint16(30000 + i)
		svc.Algorithm = algorithms[i%len(algorithms)]
		if i%3 == 0 {
			svc.AffinityTimeout = time.Second
		}
		if i%4 == 1 {
			svc.ExternalTrafficPolicy = PolicyLocal
		}
		// Endpoints shift with gen: some stay, some go, some come back.
		for k := range 4 {
			svc.Endpoints = append(svc.Endpoints, Endpoint{
				Addr:     backendAddr((gen + k) % 7),
				Ready:    (gen+k)%5 != 0,
				Serving:  true,
				NodeName: []string{"n1", "n2"}[k%2],
			})
		}
		return svc
	}
	s := newTestStore(StoreOptions{Node: Node{Name: "n1"}})
	var initial []Service
	for i := range services {
		initial = append(initial, variant(i, 0))
	}
	mustUpdate(t, s, initial...)

	done := make(chan struct{})
	var writer, subscriber, wg sync.WaitGroup
	wake := s.Subscribe()
	subscriber.Add(1)
	go func() {
		defer subscriber.Done()
		for {
			select {
			case <-wake:
				_ = s.Snapshot().Balancers()
			case <-done:
				return
			}
		}
	}()
	writer.Add(1)
	go func() {
		defer writer.Done()
		for gen := 1; gen <= updates; gen++ {
			i := gen % services
			var err error
			switch gen % 10 {
			case 3:
				_, err = s.Update(nil, []ServicePortName{variant(i, gen).Name})
			case 7:
				all := make([]Service, 0, services)
				for k := range services {
					all = append(all, variant(k, gen))
				}
				_, err = s.Replace(all)
			default:
				_, err = s.Update([]Service{variant(i, gen)}, nil)
			}
			if err != nil {
				t.Errorf("update %d: %v", gen, err)
				return
			}
		}
	}()

	for r := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			now := t0
			for it := range iterations {
				now = now.Add(time.Millisecond)
				snap := s.Snapshot()
				i := (r + it) % services
				dst := netip.AddrPortFrom(clusterIP(i), 80)
				if it%2 == 1 {
					dst = netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), uint16(30000+i))
				}
				p := snap.Route(TCP, dst)
				if p == nil {
					continue // deleted by the writer for now
				}
				p.Conns().Add(1)
				client := clientAddr(r*iterations + it%50)
				var tried Tried
				for attempt := 0; attempt < 3; attempt++ {
					b := p.Pick(client, &tried, now)
					if b == nil {
						break
					}
					tried.Add(b)
					b.Acquire()
					if (r+it+attempt)%5 == 0 {
						b.ReportFailure(now)
						b.Release()
						continue
					}
					b.ReportSuccess()
					_ = b.Active()
					_ = b.CoolingDown(now)
					b.Release()
					break
				}
				p.Conns().Add(-1)
			}
		}()
	}
	wg.Wait()
	writer.Wait()
	close(done)
	subscriber.Wait()

	snap := s.Snapshot()
	if snap.Len() == 0 {
		t.Fatal("final snapshot is empty")
	}
	for _, bal := range snap.Balancers() {
		if n := bal.Internal.Conns().Load(); n != 0 {
			t.Errorf("%v: Conns() = %d after every connection ended, want 0", bal.Service.Name, n)
		}
		for _, p := range []*Pool{bal.Internal, bal.External} {
			for _, b := range p.Backends() {
				if n := b.Active(); n != 0 {
					t.Errorf("%v backend %v: Active() = %d after every connection ended, want 0", bal.Service.Name, b.Addr, n)
				}
			}
		}
	}
}
