package lb

import (
	"net/netip"
	"strconv"
	"testing"
)

// benchClients is how many distinct client IPs the Pick benchmarks cycle
// through (a power of two).
const benchClients = 4096

func BenchmarkPick(b *testing.B) {
	clients := make([]netip.Addr, benchClients)
	for i := range clients {
		clients[i] = clientAddr(i)
	}
	for _, bc := range []struct {
		name     string
		algo     Algorithm
		affinity bool
	}{
		{"round-robin", RoundRobin, false},
		{"random", Random, false},
		{"least-conn", LeastConn, false},
		{"maglev", Maglev, false},
		{"affinity", RoundRobin, true},
	} {
		for _, n := range []int{3, 100} {
			b.Run(bc.name+"/backends="+strconv.Itoa(n), func(b *testing.B) {
				_, p := testPool(b, bc.algo, n, func(s *Service) {
					if bc.affinity {
						s.AffinityTimeout = DefaultAffinityTimeout
					}
				})
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					i := 0
					for pb.Next() {
						var tried Tried
						if p.Pick(clients[i&(benchClients-1)], &tried, t0) == nil {
							panic("Pick returned nil")
						}
						i++
					}
				})
			})
		}
	}
}

// benchStore returns a store holding n Services, each with three endpoints,
// a ClusterIP and a NodePort.
func benchStore(b *testing.B, n int) *Store {
	s := newTestStore(StoreOptions{})
	svcs := make([]Service, n)
	for i := range svcs {
		svcs[i] = benchService(i, 0)
	}
	mustUpdate(b, s, svcs...)
	return s
}

func benchService(i, gen int) Service {
	return Service{
		Name:       ServicePortName{Namespace: "ns" + strconv.Itoa(i%100), Name: "svc" + strconv.Itoa(i), Port: "http"},
		Port:       80,
		ClusterIPs: []netip.Addr{clusterIP(i)},
		NodePort:   uint16(20000 + i),
		Endpoints: []Endpoint{
			{Addr: netip.AddrPortFrom(backendAddr(3*i).Addr(), uint16(8080+gen%4)), Ready: true}, // changes with gen
			{Addr: backendAddr(3*i + 1), Ready: true},
			{Addr: backendAddr(3*i + 2), Ready: true},
		},
	}
}

func BenchmarkRoute(b *testing.B) {
	for _, n := range []int{100, 10000} {
		b.Run("services="+strconv.Itoa(n), func(b *testing.B) {
			snap := benchStore(b, n).Snapshot()
			// A mix of ClusterIP hits, NodePort hits and misses.
			dsts := make([]netip.AddrPort, 1024)
			for i := range dsts {
				switch k := i * 7919 % n; i % 4 {
				case 0, 1:
					dsts[i] = netip.AddrPortFrom(clusterIP(k), 80)
				case 2:
					dsts[i] = netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), uint16(20000+k))
				default:
					dsts[i] = netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), 1)
				}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				snap.Route(TCP, dsts[i&(len(dsts)-1)])
				i++
			}
		})
	}
}

// BenchmarkStoreUpdate upserts one changed Service into a store already
// holding n, publishing a Snapshot each time.
func BenchmarkStoreUpdate(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run("services="+strconv.Itoa(n), func(b *testing.B) {
			s := benchStore(b, n)
			b.ReportAllocs()
			gen := 0
			for b.Loop() {
				gen++
				if _, err := s.Update([]Service{benchService(gen%n, gen)}, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkMaglevTable(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run("backends="+strconv.Itoa(n), func(b *testing.B) {
			backends := make([]*Backend, n)
			for i := range backends {
				backends[i] = newBackend(TCP, backendAddr(i), HealthPolicy{})
			}
			b.ReportAllocs()
			for b.Loop() {
				maglevTable(backends)
			}
		})
	}
}
