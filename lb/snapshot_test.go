package lb

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"
)

// owned is one frontend Snapshot.Frontends yields, with the kind of pool.
type owned struct {
	Frontend Frontend
	External bool
}

func TestSnapshotFrontends(t *testing.T) {
	ip := netip.MustParseAddr
	fe := func(s string) Frontend { return Frontend{TCP, netip.MustParseAddrPort(s)} }
	svc := func(name string, edit func(*Service)) Service {
		s := testService(name, 1)
		s.ClusterIPs = nil
		edit(&s)
		return s
	}
	for _, tc := range []struct {
		name      string
		services  []Service
		want      map[string][]owned // by Service name
		nodePorts map[string]uint16
	}{
		{
			name: "every kind, in order",
			services: []Service{svc("web", func(s *Service) {
				s.ClusterIPs = []netip.Addr{ip("10.96.0.1"), ip("fd00:96::1")}
				s.ExternalIPs = []netip.Addr{ip("192.0.2.1")}
				s.LoadBalancerIPs = []netip.Addr{ip("198.51.100.1")}
				s.NodePort = 30080
			})},
			want: map[string][]owned{"web": {
				{fe("10.96.0.1:80"), false}, {fe("[fd00:96::1]:80"), false}, {fe("192.0.2.1:80"), true}, {fe("198.51.100.1:80"), true},
			}},
			nodePorts: map[string]uint16{"web": 30080},
		},
		{
			name: "an IPv4-mapped address is yielded unmapped",
			services: []Service{svc("web", func(s *Service) {
				s.LoadBalancerIPs = []netip.Addr{ip("::ffff:198.51.100.1")}
			})},
			want:      map[string][]owned{"web": {{fe("198.51.100.1:80"), true}}},
			nodePorts: map[string]uint16{"web": 0},
		},
		{
			name: "a frontend lost in a conflict is left out, the others stay",
			services: []Service{
				svc("a", func(s *Service) { s.ClusterIPs = []netip.Addr{ip("10.96.0.1")} }),
				svc("b", func(s *Service) {
					s.ClusterIPs = []netip.Addr{ip("10.96.0.2")}
					s.ExternalIPs = []netip.Addr{ip("10.96.0.1")}
				}),
			},
			want: map[string][]owned{
				"a": {{fe("10.96.0.1:80"), false}},
				"b": {{fe("10.96.0.2:80"), false}},
			},
			nodePorts: map[string]uint16{"a": 0, "b": 0},
		},
		{
			name: "a NodePort lost in a conflict is 0",
			services: []Service{
				svc("a", func(s *Service) { s.NodePort = 30080 }),
				svc("b", func(s *Service) { s.NodePort = 30080; s.ClusterIPs = []netip.Addr{ip("10.96.0.2")} }),
			},
			want: map[string][]owned{
				"a": nil,
				"b": {{fe("10.96.0.2:80"), false}},
			},
			nodePorts: map[string]uint16{"a": 30080, "b": 0},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStore(StoreOptions{})
			snap, _ := s.Replace(tc.services) // conflicts are reported; the winners serve
			for name, want := range tc.want {
				b := snap.Balancer(nameOf(name))
				var got []owned
				for f, p := range snap.Frontends(b) {
					want := b.Internal
					if p.External {
						want = b.External
					}
					if p != want {
						t.Errorf("%s: frontend %v has a pool that is not its own", name, f)
					}
					if routed := snap.Route(f.Protocol, f.Addr); routed != p {
						t.Errorf("%s: frontend %v yielded with a pool Route does not give", name, f)
					}
					got = append(got, owned{f, p.External})
				}
				if !slices.Equal(got, want) {
					t.Errorf("%s: Frontends = %v, want %v", name, got, want)
				}
				if got, want := snap.NodePort(b), tc.nodePorts[name]; got != want {
					t.Errorf("%s: NodePort = %d, want %d", name, got, want)
				}
			}
		})
	}
}

func TestSnapshotFrontendsStops(t *testing.T) {
	s := testService("web", 1)
	s.ClusterIPs = []netip.Addr{clusterIP(1), clusterIP(2)}
	s.ExternalIPs = []netip.Addr{clusterIP(3)}
	snap := mustUpdate(t, newTestStore(StoreOptions{}), s)
	n := 0
	for range snap.Frontends(snap.Balancer(s.Name)) {
		n++
		if n == 2 {
			break
		}
	}
	if n != 2 {
		t.Errorf("stopped after %d frontends, want 2", n)
	}
}

func TestSnapshotChanged(t *testing.T) {
	local := func(name string) Service {
		s := testService(name, 2)
		s.ClusterIPs = []netip.Addr{clusterIP(len(name))}
		s.InternalTrafficPolicy = PolicyLocal
		s.Endpoints[0].NodeName = "node-a"
		s.Endpoints[1].NodeName = "node-b"
		return s
	}
	web, db := testService("web", 2), testService("db", 1)
	db.ClusterIPs = []netip.Addr{clusterIP(2)}
	// zoned's Local pools hold node-a's endpoint whatever the zone; its
	// short circuit (Cluster endpoints) follows the zone's hints.
	zoned := local("zoned")
	zoned.ExternalTrafficPolicy, zoned.NodePort = PolicyLocal, 30080
	zoned.Endpoints[0].ZoneHints, zoned.Endpoints[1].ZoneHints = []string{"z1"}, []string{"z2"}
	edit := func(s Service, fn func(*Service)) Service {
		s.Endpoints = slices.Clone(s.Endpoints)
		fn(&s)
		return s
	}
	names := func(ns ...string) []ServicePortName {
		var out []ServicePortName
		for _, n := range ns {
			out = append(out, nameOf(n))
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		before func(*Store) // nil: no previous snapshot
		after  func(*Store)
		want   Diff
	}{
		{
			name:  "no previous snapshot: everything is added",
			after: func(s *Store) { s.Replace([]Service{web, db}) },
			want:  Diff{Added: names("db", "web")},
		},
		{
			name:   "the same Services written again change nothing",
			before: func(s *Store) { s.Replace([]Service{web, db}) },
			after:  func(s *Store) { s.Replace([]Service{web, db}) },
		},
		{
			name:   "an empty write changes nothing",
			before: func(s *Store) { s.Replace([]Service{web, db}) },
			after:  func(s *Store) { s.Update(nil, nil) },
		},
		{
			name:   "added, updated and removed",
			before: func(s *Store) { s.Replace([]Service{web, db}) },
			after: func(s *Store) {
				s.Replace([]Service{edit(web, func(s *Service) { s.Endpoints[1].Ready = false }), testService("zz", 1)})
			},
			want: Diff{Added: names("zz"), Updated: names("web"), Removed: names("db")},
		},
		{
			name:   "a health-check node port is a change",
			before: func(s *Store) { s.Replace([]Service{web, db}) },
			after: func(s *Store) {
				s.Update([]Service{edit(web, func(s *Service) { s.HealthCheckNodePort = 32000 })}, nil)
			},
			want: Diff{Updated: names("web")},
		},
		{
			name: "a removal hands a contested frontend to the loser",
			before: func(s *Store) {
				s.Replace([]Service{edit(db, func(s *Service) { s.ClusterIPs = web.ClusterIPs }), web})
			},
			after: func(s *Store) { s.Update(nil, names("db")) },
			want:  Diff{Updated: names("web"), Removed: names("db")},
		},
		{
			name: "a contest that changes no owner changes nothing",
			before: func(s *Store) {
				s.Replace([]Service{edit(db, func(s *Service) { s.ClusterIPs = web.ClusterIPs }), web})
			},
			after: func(s *Store) { s.Update([]Service{edit(db, func(s *Service) { s.ClusterIPs = web.ClusterIPs })}, nil) },
			want:  Diff{},
		},
		{
			name:   "a new node decides Local pools again",
			before: func(s *Store) { s.Replace([]Service{local("loc"), web}) },
			after:  func(s *Store) { s.SetNode(Node{Name: "node-b"}) },
			want:   Diff{Updated: names("loc")},
		},
		{
			name: "a short circuit decided again alone is a change",
			before: func(s *Store) {
				s.SetNode(Node{Name: "node-a", Zone: "z1"})
				s.Replace([]Service{zoned, web})
			},
			after: func(s *Store) { s.SetNode(Node{Name: "node-a", Zone: "z2"}) },
			want:  Diff{Updated: names("zoned")},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStore(StoreOptions{Node: Node{Name: "node-a"}})
			var prev *Snapshot
			if tc.before != nil {
				tc.before(s)
				prev = s.Snapshot()
			}
			tc.after(s)
			got := s.Snapshot().Changed(prev)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Changed = %+v, want %+v", got, tc.want)
			}
			if got.Empty() != (len(tc.want.Added)+len(tc.want.Updated)+len(tc.want.Removed) == 0) {
				t.Errorf("Empty = %v for %+v", got.Empty(), got)
			}
		})
	}
}

// TestSnapshotChangedAgreesWithRoute: over random writes to a few Services
// sharing a few addresses (so frontends are contested and change hands),
// Changed reports exactly the ports whose content, backends or routed
// frontends differ, judged the slow way: by Route.
func TestSnapshotChangedAgreesWithRoute(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ips := []netip.Addr{clusterIP(1), clusterIP(2), clusterIP(3)}
	random := func(name string) Service {
		s := testService(name, 1+rng.IntN(3))
		s.ClusterIPs = []netip.Addr{ips[rng.IntN(len(ips))]}
		if rng.IntN(2) == 0 {
			s.ExternalIPs = []netip.Addr{ips[rng.IntN(len(ips))]}
		}
		if rng.IntN(2) == 0 {
			s.NodePort = 30000 + uint16(rng.IntN(2))
		}
		return s
	}
	// view is what a mode sees of one port: content, backends, and which
	// of its frontends Route sends to it.
	view := func(snap *Snapshot, b *Balancer) string {
		v := fmt.Sprintf("%+v %v %v", *b.Service, addrs(b.Internal.Backends()), addrs(b.External.Backends()))
		for _, ip := range slices.Concat(b.Service.ClusterIPs, b.Service.ExternalIPs) {
			p := snap.Route(b.Service.Protocol, netip.AddrPortFrom(ip, b.Service.Port))
			v += fmt.Sprintf(" %v:%v", ip, p == b.Internal || p == b.External)
		}
		if np := b.Service.NodePort; np != 0 {
			v += fmt.Sprintf(" np:%v", snap.Route(b.Service.Protocol, netip.AddrPortFrom(netip.IPv4Unspecified(), np)) == b.External)
		}
		return v
	}
	names := []string{"a", "b", "c", "d"}
	s := newTestStore(StoreOptions{})
	prev := s.Snapshot()
	for step := range 500 {
		switch rng.IntN(4) {
		case 0:
			s.Update(nil, []ServicePortName{nameOf(names[rng.IntN(len(names))])})
		case 1:
			cur := prev.Balancer(nameOf(names[rng.IntN(len(names))]))
			if cur != nil {
				s.Update([]Service{*cur.Service}, nil) // the same again
			}
		default:
			s.Update([]Service{random(names[rng.IntN(len(names))])}, nil)
		}
		snap := s.Snapshot()
		var want Diff
		for _, n := range names {
			a, b := prev.Balancer(nameOf(n)), snap.Balancer(nameOf(n))
			switch {
			case a == nil && b != nil:
				want.Added = append(want.Added, nameOf(n))
			case a != nil && b == nil:
				want.Removed = append(want.Removed, nameOf(n))
			case a != nil && view(prev, a) != view(snap, b):
				want.Updated = append(want.Updated, nameOf(n))
			}
		}
		for _, l := range []*[]ServicePortName{&want.Added, &want.Updated, &want.Removed} {
			slices.SortFunc(*l, ServicePortName.Compare)
		}
		if got := snap.Changed(prev); !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d: Changed = %+v, want %+v", step, got, want)
		}
		prev = snap
	}
}

// TestServiceEqualCoversEveryField: a field added to Service or Endpoint
// and forgotten in equal would make Changed miss a change.
func TestServiceEqualCoversEveryField(t *testing.T) {
	base := testService("web", 1)
	base.Endpoints[0].ZoneHints = []string{"z"}
	nonzero := func(v reflect.Value) {
		switch v.Kind() {
		case reflect.String:
			v.SetString(v.String() + "x")
		case reflect.Bool:
			v.SetBool(!v.Bool())
		case reflect.Uint8, reflect.Uint16, reflect.Uint64:
			v.SetUint(v.Uint() + 1)
		case reflect.Int64:
			v.SetInt(v.Int() + 1)
		case reflect.Slice:
			v.Set(reflect.Append(reflect.MakeSlice(v.Type(), 0, v.Len()+1), reflect.New(v.Type().Elem()).Elem()))
		case reflect.Struct: // netip values and ServicePortName
			switch x := v.Addr().Interface().(type) {
			case *netip.AddrPort:
				*x = netip.AddrPortFrom(x.Addr(), x.Port()+1)
			case *ServicePortName:
				x.Port += "x"
			default:
				t.Fatalf("no way to change a %s: teach this test", v.Type())
			}
		default:
			t.Fatalf("no way to change a %s: teach this test", v.Type())
		}
	}
	st := reflect.TypeFor[Service]()
	for i := range st.NumField() {
		changed := base
		changed.Endpoints = slices.Clone(base.Endpoints)
		nonzero(reflect.ValueOf(&changed).Elem().Field(i))
		if base.equal(&changed) {
			t.Errorf("Service.equal misses a change of %s", st.Field(i).Name)
		}
	}
	et := reflect.TypeFor[Endpoint]()
	for i := range et.NumField() {
		changed := base
		changed.Endpoints = slices.Clone(base.Endpoints)
		nonzero(reflect.ValueOf(&changed.Endpoints[0]).Elem().Field(i))
		if base.equal(&changed) {
			t.Errorf("Service.equal misses a change of Endpoint.%s", et.Field(i).Name)
		}
	}
	same := base
	same.Endpoints = slices.Clone(base.Endpoints)
	if !base.equal(&same) {
		t.Error("Service.equal differs for a copy")
	}
}

// BenchmarkChanged: a full write of unchanged Services and one changed
// endpoint, as a periodic relist brings.
func BenchmarkChanged(b *testing.B) {
	for _, n := range []int{10, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			services := make([]Service, n)
			for i := range services {
				services[i] = testService(fmt.Sprintf("svc-%d", i), 3)
				services[i].ClusterIPs = []netip.Addr{clusterIP(i)}
			}
			s := newTestStore(StoreOptions{})
			prev, _ := s.Replace(services)
			services[n/2].Endpoints = readyEndpoints(2)
			cur, _ := s.Replace(services)
			b.ReportAllocs()
			for b.Loop() {
				if d := cur.Changed(prev); len(d.Updated) != 1 {
					b.Fatalf("Changed = %+v, want one update", d)
				}
			}
		})
	}
}
