package lb

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestNewStoreEmpty(t *testing.T) {
	s := newTestStore(StoreOptions{})
	snap := s.Snapshot()
	if snap.Version != 0 || snap.Len() != 0 || len(snap.Balancers()) != 0 || !snap.Time.Equal(t0) {
		t.Errorf("first snapshot: Version %d, Len %d, Balancers %d, Time %v; want 0, 0, 0, %v", snap.Version, snap.Len(), len(snap.Balancers()), snap.Time, t0)
	}
	if p := snap.Route(TCP, netip.AddrPortFrom(clusterIP(1), 80)); p != nil {
		t.Errorf("Route on an empty store = %v, want nil", p.Service.Name)
	}
	if b := snap.Balancer(nameOf("web")); b != nil {
		t.Errorf("Balancer on an empty store = %v, want nil", b.Service.Name)
	}
}

func TestUpdateVersionsAndImmutability(t *testing.T) {
	now := t0
	s := NewStore(StoreOptions{Now: func() time.Time { return now }})

	v1 := testService("web", 2)
	now = t0.Add(time.Second)
	snap1 := mustUpdate(t, s, v1)
	if snap1.Version != 1 || !snap1.Time.Equal(now) || s.Snapshot() != snap1 {
		t.Fatalf("after first Update: Version %d, Time %v, current is it %v; want 1, %v, true", snap1.Version, snap1.Time, s.Snapshot() == snap1, now)
	}
	// The Store copied its input: the source may reuse it.
	v1.Endpoints[0].Addr = backendAddr(99)
	v1.ClusterIPs[0] = clusterIP(99)

	v2 := testService("web", 3)
	v2.ClusterIPs = []netip.Addr{clusterIP(2)}
	now = t0.Add(2 * time.Second)
	snap2 := mustUpdate(t, s, v2)
	if snap2.Version != 2 || !snap2.Time.Equal(now) || s.Snapshot() != snap2 {
		t.Fatalf("after second Update: Version %d, Time %v, current is it %v; want 2, %v, true", snap2.Version, snap2.Time, s.Snapshot() == snap2, now)
	}

	// The first snapshot is as it was published.
	old := snap1.Balancer(nameOf("web"))
	if got, want := epAddrs(old.Service.Endpoints), epAddrs(readyEndpoints(2)); !slices.Equal(got, want) {
		t.Errorf("snapshot 1 endpoints = %v, want %v", got, want)
	}
	if got, want := addrs(old.Internal.Backends()), []netip.AddrPort{backendAddr(0), backendAddr(1)}; !slices.Equal(got, want) {
		t.Errorf("snapshot 1 backends = %v, want %v", got, want)
	}
	if got := snap1.Route(TCP, netip.AddrPortFrom(clusterIP(1), 80)); got != old.Internal {
		t.Errorf("snapshot 1 Route(old ClusterIP) = %v, want its web pool", got)
	}
	if got := snap1.Route(TCP, netip.AddrPortFrom(clusterIP(2), 80)); got != nil {
		t.Errorf("snapshot 1 Route(new ClusterIP) = %v, want nil", got.Service.Name)
	}
	if snap1.Version != 1 || snap1.Len() != 1 {
		t.Errorf("snapshot 1: Version %d, Len %d; want 1, 1", snap1.Version, snap1.Len())
	}

	// The second has the new version.
	cur := snap2.Balancer(nameOf("web"))
	if got := len(cur.Internal.Backends()); got != 3 {
		t.Errorf("snapshot 2 has %d backends, want 3", got)
	}
	if got := snap2.Route(TCP, netip.AddrPortFrom(clusterIP(1), 80)); got != nil {
		t.Errorf("snapshot 2 Route(old ClusterIP) = %v, want nil", got.Service.Name)
	}
	if got := snap2.Route(TCP, netip.AddrPortFrom(clusterIP(2), 80)); got != cur.Internal {
		t.Errorf("snapshot 2 Route(new ClusterIP) = %v, want its web pool", got)
	}
}

func TestRoute(t *testing.T) {
	web := Service{
		Name:                  nameOf("web"),
		Port:                  80,
		ClusterIPs:            []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00::1")},
		ExternalIPs:           []netip.Addr{netip.MustParseAddr("203.0.113.1")},
		LoadBalancerIPs:       []netip.Addr{netip.MustParseAddr("198.51.100.1")},
		NodePort:              30080,
		ExternalTrafficPolicy: PolicyLocal,
		Endpoints: []Endpoint{
			{Addr: backendAddr(1), Ready: true, NodeName: "n1"},
			{Addr: backendAddr(2), Ready: true, NodeName: "n2"},
		},
	}
	dns := Service{
		Name:       nameOf("dns"),
		Protocol:   UDP,
		Port:       53,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		NodePort:   30053,
		Endpoints:  readyEndpoints(1),
	}
	mapped := Service{
		Name:       nameOf("mapped"),
		Port:       80,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("::ffff:10.96.0.20")},
		Endpoints:  readyEndpoints(1),
	}
	s := newTestStore(StoreOptions{Node: Node{Name: "n1"}})
	snap := mustUpdate(t, s, web, dns, mapped)

	for _, tc := range []struct {
		name     string
		proto    Protocol
		dst      string
		service  string // "": no route
		external bool
	}{
		{name: "clusterIP", dst: "10.96.0.1:80", service: "web"},
		{name: "clusterIP IPv6", dst: "[fd00::1]:80", service: "web"},
		{name: "externalIP", dst: "203.0.113.1:80", service: "web", external: true},
		{name: "loadBalancerIP", dst: "198.51.100.1:80", service: "web", external: true},
		{name: "nodePort on a node address", dst: "192.0.2.10:30080", service: "web", external: true},
		{name: "nodePort on any address", dst: "10.0.0.5:30080", service: "web", external: true},
		{name: "nodePort IPv6", dst: "[2001:db8::5]:30080", service: "web", external: true},
		{name: "nodePort on the clusterIP", dst: "10.96.0.1:30080", service: "web", external: true},
		{name: "IPv4-mapped clusterIP", dst: "[::ffff:10.96.0.1]:80", service: "web"},
		{name: "IPv4-mapped externalIP", dst: "[::ffff:203.0.113.1]:80", service: "web", external: true},
		{name: "IPv4-mapped nodePort", dst: "[::ffff:192.0.2.10]:30080", service: "web", external: true},
		{name: "clusterIP given IPv4-mapped", dst: "10.96.0.20:80", service: "mapped"},
		{name: "clusterIP given IPv4-mapped, dst mapped", dst: "[::ffff:10.96.0.20]:80", service: "mapped"},
		{name: "UDP clusterIP", proto: UDP, dst: "10.96.0.10:53", service: "dns"},
		{name: "UDP nodePort", proto: UDP, dst: "192.0.2.10:30053", service: "dns", external: true},
		{name: "TCP to a UDP clusterIP", dst: "10.96.0.10:53"},
		{name: "TCP to a UDP nodePort", dst: "192.0.2.10:30053"},
		{name: "UDP to a TCP clusterIP", proto: UDP, dst: "10.96.0.1:80"},
		{name: "UDP to a TCP nodePort", proto: UDP, dst: "192.0.2.10:30080"},
		{name: "clusterIP, wrong port", dst: "10.96.0.1:81"},
		{name: "unknown address", dst: "10.96.9.9:80"},
		{name: "unknown IPv6 address", dst: "[fd00::9]:80"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := snap.Route(tc.proto, netip.MustParseAddrPort(tc.dst))
			switch {
			case tc.service == "" && p != nil:
				t.Fatalf("Route(%v %s) = %v (external %v), want nil", tc.proto, tc.dst, p.Service.Name, p.External)
			case tc.service == "":
				return
			case p == nil:
				t.Fatalf("Route(%v %s) = nil, want %s", tc.proto, tc.dst, tc.service)
			}
			if p.Service.Name != nameOf(tc.service) || p.External != tc.external {
				t.Errorf("Route(%v %s) = %v (external %v), want %v (external %v)", tc.proto, tc.dst, p.Service.Name, p.External, nameOf(tc.service), tc.external)
			}
			bal := snap.Balancer(nameOf(tc.service))
			if want := bal.Internal; tc.external {
				want = bal.External
				if p != want {
					t.Errorf("Route(%v %s) is not the Balancer's external pool", tc.proto, tc.dst)
				}
			} else if p != want {
				t.Errorf("Route(%v %s) is not the Balancer's internal pool", tc.proto, tc.dst)
			}
		})
	}

	// ExternalTrafficPolicy Local: the external pool has only n1's endpoint.
	bal := snap.Balancer(web.Name)
	if got, want := addrs(bal.Internal.Backends()), []netip.AddrPort{backendAddr(1), backendAddr(2)}; !slices.Equal(got, want) {
		t.Errorf("web internal backends = %v, want %v", got, want)
	}
	if got, want := addrs(bal.External.Backends()), []netip.AddrPort{backendAddr(1)}; !slices.Equal(got, want) {
		t.Errorf("web external backends = %v, want %v", got, want)
	}
}

func TestRouteAllocs(t *testing.T) {
	s := newTestStore(StoreOptions{})
	svc := testService("web", 3)
	svc.NodePort = 30080
	snap := mustUpdate(t, s, svc)
	for _, dst := range []string{"10.96.0.1:80", "[::ffff:10.96.0.1]:80", "192.0.2.1:30080", "192.0.2.1:1"} {
		d := netip.MustParseAddrPort(dst)
		if n := testing.AllocsPerRun(100, func() { snap.Route(TCP, d) }); n != 0 {
			t.Errorf("Route(%s): %v allocations, want 0", dst, n)
		}
	}
}

func TestPoolsSharedWhenPoliciesAgree(t *testing.T) {
	for _, tc := range []struct {
		name     string
		itp, etp TrafficPolicy
	}{
		{"both cluster", PolicyCluster, PolicyCluster},
		{"both local", PolicyLocal, PolicyLocal},
		{"internal local", PolicyLocal, PolicyCluster},
		{"external local", PolicyCluster, PolicyLocal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStore(StoreOptions{Node: Node{Name: "n1"}})
			svc := testService("web", 0)
			svc.InternalTrafficPolicy, svc.ExternalTrafficPolicy = tc.itp, tc.etp
			svc.Endpoints = []Endpoint{
				{Addr: backendAddr(1), Ready: true, NodeName: "n1"},
				{Addr: backendAddr(2), Ready: true, NodeName: "n2"},
			}
			bal := mustUpdate(t, s, svc).Balancer(svc.Name)
			if bal.Internal.External || !bal.External.External {
				t.Errorf("External flags: internal %v, external %v; want false, true", bal.Internal.External, bal.External.External)
			}
			want := func(p TrafficPolicy) []netip.AddrPort {
				if p == PolicyLocal {
					return []netip.AddrPort{backendAddr(1)}
				}
				return []netip.AddrPort{backendAddr(1), backendAddr(2)}
			}
			if got := addrs(bal.Internal.Backends()); !slices.Equal(got, want(tc.itp)) {
				t.Errorf("internal backends = %v, want %v", got, want(tc.itp))
			}
			if got := addrs(bal.External.Backends()); !slices.Equal(got, want(tc.etp)) {
				t.Errorf("external backends = %v, want %v", got, want(tc.etp))
			}
			if bal.Internal.Conns() != bal.External.Conns() {
				t.Errorf("internal and external pools count connections separately, want one counter per Service port")
			}
			if bal.Internal.ShortCircuit() != nil {
				t.Errorf("the internal pool has a short circuit")
			}
			if tc.etp == PolicyCluster {
				if bal.ShortCircuit != nil || bal.External.ShortCircuit() != nil {
					t.Errorf("a short circuit with an external policy of Cluster")
				}
				return
			}
			// External Local: clients inside the cluster get every
			// endpoint, whatever the internal policy.
			sc := bal.ShortCircuit
			switch {
			case sc == nil || bal.External.ShortCircuit() != sc:
				t.Fatalf("short circuit %p, the external pool's %p: want the same pool", sc, bal.External.ShortCircuit())
			case !sc.External || sc.ShortCircuit() != nil:
				t.Errorf("short circuit: External %v, its own short circuit %p; want true, none", sc.External, sc.ShortCircuit())
			case sc.Conns() != bal.Internal.Conns():
				t.Errorf("the short circuit counts connections separately")
			}
			if got := addrs(sc.Backends()); !slices.Equal(got, want(PolicyCluster)) {
				t.Errorf("short-circuit backends = %v, want %v", got, want(PolicyCluster))
			}
		})
	}
}

func TestFrontendConflict(t *testing.T) {
	base := func(name string) Service {
		svc := testService(name, 1)
		svc.ClusterIPs = nil
		return svc
	}
	ip := netip.MustParseAddr
	for _, tc := range []struct {
		name     string
		a, b     func(*Service)
		frontend Frontend // routed to a
		conflict bool
	}{
		{
			name:     "same clusterIP",
			a:        func(s *Service) { s.ClusterIPs = []netip.Addr{ip("10.96.0.1")} },
			b:        func(s *Service) { s.ClusterIPs = []netip.Addr{ip("10.96.0.1")} },
			frontend: Frontend{TCP, netip.MustParseAddrPort("10.96.0.1:80")},
			conflict: true,
		},
		{
			name:     "clusterIP of one is externalIP of the other",
			a:        func(s *Service) { s.ClusterIPs = []netip.Addr{ip("10.96.0.1")} },
			b:        func(s *Service) { s.ExternalIPs = []netip.Addr{ip("10.96.0.1")} },
			frontend: Frontend{TCP, netip.MustParseAddrPort("10.96.0.1:80")},
			conflict: true,
		},
		{
			name:     "same loadBalancerIP, one IPv4-mapped",
			a:        func(s *Service) { s.LoadBalancerIPs = []netip.Addr{ip("198.51.100.1")} },
			b:        func(s *Service) { s.LoadBalancerIPs = []netip.Addr{ip("::ffff:198.51.100.1")} },
			frontend: Frontend{TCP, netip.MustParseAddrPort("198.51.100.1:80")},
			conflict: true,
		},
		{
			name:     "same nodePort",
			a:        func(s *Service) { s.NodePort = 30080 },
			b:        func(s *Service) { s.NodePort = 30080 },
			frontend: Frontend{TCP, netip.MustParseAddrPort("192.0.2.1:30080")},
			conflict: true,
		},
		{
			name:     "same clusterIP, other port",
			a:        func(s *Service) { s.ClusterIPs = []netip.Addr{ip("10.96.0.1")} },
			b:        func(s *Service) { s.ClusterIPs = []netip.Addr{ip("10.96.0.1")}; s.Port = 81 },
			frontend: Frontend{TCP, netip.MustParseAddrPort("10.96.0.1:80")},
		},
		{
			name:     "same clusterIP, other protocol",
			a:        func(s *Service) { s.ClusterIPs = []netip.Addr{ip("10.96.0.1")} },
			b:        func(s *Service) { s.ClusterIPs = []netip.Addr{ip("10.96.0.1")}; s.Protocol = UDP },
			frontend: Frontend{TCP, netip.MustParseAddrPort("10.96.0.1:80")},
		},
		{
			name:     "same nodePort, other protocol",
			a:        func(s *Service) { s.NodePort = 30080 },
			b:        func(s *Service) { s.NodePort = 30080; s.Protocol = UDP },
			frontend: Frontend{TCP, netip.MustParseAddrPort("192.0.2.1:30080")},
		},
		{
			name:     "same clusterIP and nodePort, SCTP beside TCP",
			a:        func(s *Service) { s.ClusterIPs = []netip.Addr{ip("10.96.0.1")}; s.NodePort = 30080 },
			b:        func(s *Service) { s.ClusterIPs = []netip.Addr{ip("10.96.0.1")}; s.NodePort = 30080; s.Protocol = SCTP },
			frontend: Frontend{TCP, netip.MustParseAddrPort("10.96.0.1:80")},
		},
		{
			name:     "same clusterIP, both SCTP",
			a:        func(s *Service) { s.ClusterIPs = []netip.Addr{ip("10.96.0.1")}; s.Protocol = SCTP },
			b:        func(s *Service) { s.ClusterIPs = []netip.Addr{ip("10.96.0.1")}; s.Protocol = SCTP },
			frontend: Frontend{SCTP, netip.MustParseAddrPort("10.96.0.1:80")},
			conflict: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := base("a"), base("b")
			tc.a(&a)
			tc.b(&b)
			s := newTestStore(StoreOptions{})
			// b is upserted first, yet a, whose name sorts first, wins.
			snap, err := s.Update([]Service{b, a}, nil)
			if !tc.conflict {
				if err != nil {
					t.Fatalf("Update: %v, want no error", err)
				}
			} else {
				if err == nil {
					t.Fatalf("Update: no error, want a conflict naming %v and %v", a.Name, b.Name)
				}
				for _, want := range []string{a.Name.String(), b.Name.String()} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not name %v", err, want)
					}
				}
			}
			if got := snap.Route(tc.frontend.Protocol, tc.frontend.Addr); got == nil || got.Service.Name != a.Name {
				t.Fatalf("Route(%v) = %v, want %v", tc.frontend, got, a.Name)
			}
			if snap.Len() != 2 {
				t.Errorf("Len() = %d, want both services stored", snap.Len())
			}
			if !tc.conflict {
				return
			}
			// When a goes, b gets the frontend and the conflict is over.
			snap, err = s.Update(nil, []ServicePortName{a.Name})
			if err != nil {
				t.Fatalf("deleting %v: %v, want no error", a.Name, err)
			}
			if got := snap.Route(tc.frontend.Protocol, tc.frontend.Addr); got == nil || got.Service.Name != b.Name {
				t.Errorf("after deleting %v: Route(%v) = %v, want %v", a.Name, tc.frontend, got, b.Name)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	ip := netip.MustParseAddr
	for _, tc := range []struct {
		name  string
		mod   func(*Service)
		field string // "": valid
	}{
		{name: "valid", mod: func(*Service) {}},
		{name: "nodePort only", mod: func(s *Service) { s.ClusterIPs = nil; s.NodePort = 30000 }},
		{name: "no namespace", mod: func(s *Service) { s.Name.Namespace = "" }, field: "namespace"},
		{name: "no name", mod: func(s *Service) { s.Name.Name = "" }, field: "name"},
		{name: "bad protocol", mod: func(s *Service) { s.Protocol = 7 }, field: "protocol"},
		{name: "port 0", mod: func(s *Service) { s.Port = 0 }, field: "port"},
		{name: "no frontend", mod: func(s *Service) { s.ClusterIPs = nil }, field: "clusterIPs"},
		{name: "unspecified clusterIP", mod: func(s *Service) { s.ClusterIPs = []netip.Addr{ip("0.0.0.0")} }, field: "clusterIPs[0]"},
		{name: "unspecified clusterIP, IPv4-mapped", mod: func(s *Service) { s.ClusterIPs = []netip.Addr{ip("::ffff:0.0.0.0")} }, field: "clusterIPs[0]"},
		{name: "multicast externalIP, IPv4-mapped", mod: func(s *Service) { s.ExternalIPs = []netip.Addr{ip("::ffff:224.0.0.1")} }, field: "externalIPs[0]"},
		{name: "zero clusterIP", mod: func(s *Service) { s.ClusterIPs = append(s.ClusterIPs, netip.Addr{}) }, field: "clusterIPs[1]"},
		{name: "multicast externalIP", mod: func(s *Service) { s.ExternalIPs = []netip.Addr{ip("224.0.0.1")} }, field: "externalIPs[0]"},
		{name: "unspecified loadBalancerIP", mod: func(s *Service) { s.LoadBalancerIPs = []netip.Addr{ip("::")} }, field: "loadBalancerIPs[0]"},
		{name: "source ranges", mod: func(s *Service) {
			s.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/64")}
		}},
		{name: "unmasked source range", mod: func(s *Service) {
			s.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("10.1.2.3/16")}
		}, field: "loadBalancerSourceRanges[1]"},
		{name: "zero source range", mod: func(s *Service) { s.LoadBalancerSourceRanges = []netip.Prefix{{}} }, field: "loadBalancerSourceRanges[0]"},
		{name: "negative affinity", mod: func(s *Service) { s.AffinityTimeout = -time.Second }, field: "sessionAffinityTimeout"},
		{name: "bad internal policy", mod: func(s *Service) { s.InternalTrafficPolicy = 2 }, field: "internalTrafficPolicy"},
		{name: "bad external policy", mod: func(s *Service) { s.ExternalTrafficPolicy = 2 }, field: "externalTrafficPolicy"},
		{name: "bad algorithm", mod: func(s *Service) { s.Algorithm = Maglev + 1 }, field: "algorithm"},
		{name: "endpoint address", mod: func(s *Service) { s.Endpoints[1].Addr = netip.AddrPortFrom(ip("0.0.0.0"), 80) }, field: "endpoints[1].address"},
		{name: "unspecified endpoint, IPv4-mapped", mod: func(s *Service) { s.Endpoints[0].Addr = netip.AddrPortFrom(ip("::ffff:0.0.0.0"), 80) }, field: "endpoints[0].address"},
		{name: "endpoint port", mod: func(s *Service) { s.Endpoints[0].Addr = netip.AddrPortFrom(ip("10.1.0.9"), 0) }, field: "endpoints[0].port"},
		{name: "duplicate endpoint", mod: func(s *Service) { s.Endpoints[1].Addr = s.Endpoints[0].Addr }, field: "endpoints[1].address"},
		{
			name: "duplicate endpoint, IPv4-mapped",
			mod: func(s *Service) {
				s.Endpoints[1].Addr = netip.AddrPortFrom(netip.AddrFrom16(s.Endpoints[0].Addr.Addr().As16()), s.Endpoints[0].Addr.Port())
			},
			field: "endpoints[1].address",
		},
		{name: "same address, other port", mod: func(s *Service) {
			s.Endpoints[1].Addr = netip.AddrPortFrom(s.Endpoints[0].Addr.Addr(), 9090)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := testService("web", 2)
			tc.mod(&svc)
			err := svc.Validate()
			switch {
			case tc.field == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tc.field != "" && err == nil:
				t.Errorf("Validate() = nil, want an error naming %s", tc.field)
			case tc.field != "" && !strings.HasPrefix(err.Error(), tc.field+": "):
				t.Errorf("Validate() = %q, want it to start with %q", err, tc.field+": ")
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	svc := Service{Endpoints: []Endpoint{{}}}
	err := svc.Validate()
	if err == nil {
		t.Fatal("Validate() = nil, want errors")
	}
	for _, field := range []string{"namespace", "name", "port", "clusterIPs", "endpoints[0].address"} {
		if !strings.Contains(err.Error(), field+": ") {
			t.Errorf("Validate() = %q, want it to name %s", err, field)
		}
	}
}

func TestUpdateInvalidService(t *testing.T) {
	s := newTestStore(StoreOptions{})
	good := testService("good", 1)
	keep := testService("keep", 2)
	keep.ClusterIPs = []netip.Addr{clusterIP(2)}
	mustUpdate(t, s, keep)

	// A new version of keep with port 0, a new good service, a new bad one.
	badKeep := testService("keep", 3)
	badKeep.ClusterIPs = []netip.Addr{clusterIP(3)}
	badKeep.Port = 0
	bad := testService("bad", 1)
	bad.ClusterIPs = []netip.Addr{clusterIP(4)}
	bad.AffinityTimeout = -1
	snap, err := s.Update([]Service{badKeep, good, bad}, nil)
	if err == nil {
		t.Fatal("Update: no error, want the invalid services reported")
	}
	for _, want := range []string{"default/keep:http", "port: ", "default/bad:http", "sessionAffinityTimeout: "} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "default/good") {
		t.Errorf("error %q names the valid service", err)
	}
	if snap.Version != 2 || s.Snapshot() != snap {
		t.Errorf("Version = %d, current %v; want 2, true: the valid part is published", snap.Version, s.Snapshot() == snap)
	}
	if snap.Balancer(good.Name) == nil {
		t.Errorf("valid service %v not applied", good.Name)
	}
	if snap.Balancer(bad.Name) != nil {
		t.Errorf("invalid new service %v applied", bad.Name)
	}
	// keep stays at its previous version.
	kb := snap.Balancer(keep.Name)
	if kb == nil {
		t.Fatalf("previous version of %v dropped", keep.Name)
	}
	if kb.Service.Port != 80 || len(kb.Internal.Backends()) != 2 {
		t.Errorf("%v: port %d with %d backends, want the previous version's 80 with 2", keep.Name, kb.Service.Port, len(kb.Internal.Backends()))
	}
	if p := snap.Route(TCP, netip.AddrPortFrom(clusterIP(2), 80)); p == nil || p.Service.Name != keep.Name {
		t.Errorf("previous frontend of %v not routed", keep.Name)
	}
	if p := snap.Route(TCP, netip.AddrPortFrom(clusterIP(3), 80)); p != nil {
		t.Errorf("rejected frontend routed to %v", p.Service.Name)
	}
}

func TestUpdateDelete(t *testing.T) {
	s := newTestStore(StoreOptions{})
	a, b := testService("a", 1), testService("b", 2)
	b.ClusterIPs = []netip.Addr{clusterIP(2)}
	mustUpdate(t, s, a, b)
	snap, err := s.Update(nil, []ServicePortName{a.Name, nameOf("never-there")})
	if err != nil {
		t.Fatalf("Update: %v, want deleting a missing service to be no error", err)
	}
	if snap.Balancer(a.Name) != nil || snap.Route(TCP, netip.AddrPortFrom(clusterIP(1), 80)) != nil {
		t.Errorf("deleted service %v still present", a.Name)
	}
	if snap.Balancer(b.Name) == nil || snap.Len() != 1 {
		t.Errorf("Len() = %d, want only %v left", snap.Len(), b.Name)
	}
	// Delete and upsert of one name in one Update: the upsert wins.
	snap = mustUpdateDelete(t, s, []Service{a}, []ServicePortName{a.Name})
	if snap.Balancer(a.Name) == nil {
		t.Errorf("upsert with delete of the same name: %v missing", a.Name)
	}
}

func mustUpdateDelete(t *testing.T, s *Store, upserts []Service, deletes []ServicePortName) *Snapshot {
	t.Helper()
	snap, err := s.Update(upserts, deletes)
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	return snap
}

func TestReplace(t *testing.T) {
	s := newTestStore(StoreOptions{})
	var svcs []Service
	for i, name := range []string{"a", "b", "c", "d"} {
		svc := testService(name, 2)
		svc.ClusterIPs = []netip.Addr{clusterIP(i)}
		svcs = append(svcs, svc)
	}
	mustUpdate(t, s, svcs...)

	// Keep a, change c, drop b and d, add e.
	c := svcs[2]
	c.Endpoints = readyEndpoints(3)
	e := testService("e", 1)
	e.ClusterIPs = []netip.Addr{clusterIP(9)}
	snap, err := s.Replace([]Service{svcs[0], c, e})
	if err != nil {
		t.Fatalf("Replace: %v", err)
	}
	var got []string
	for _, bal := range snap.Balancers() {
		got = append(got, bal.Service.Name.Name)
	}
	if want := []string{"a", "c", "e"}; !slices.Equal(got, want) {
		t.Errorf("services after Replace = %v, want %v", got, want)
	}
	if p := snap.Route(TCP, netip.AddrPortFrom(clusterIP(1), 80)); p != nil {
		t.Errorf("removed service b still routed: %v", p.Service.Name)
	}
	if n := len(snap.Balancer(c.Name).Internal.Backends()); n != 3 {
		t.Errorf("c has %d backends, want 3", n)
	}

	// An invalid new version of a named service keeps the old one.
	badA := svcs[0]
	badA.Port = 0
	snap, err = s.Replace([]Service{badA, c, e})
	if err == nil {
		t.Errorf("Replace: no error, want %v reported", badA.Name)
	}
	if bal := snap.Balancer(badA.Name); bal == nil || bal.Service.Port != 80 {
		t.Errorf("invalid update of %v: got %v, want the previous version kept", badA.Name, bal)
	}

	// Replace with nothing empties the store and frees its state.
	snap, err = s.Replace(nil)
	if err != nil || snap.Len() != 0 {
		t.Errorf("Replace(nil): Len %d, err %v; want 0, nil", snap.Len(), err)
	}
	s.mu.Lock()
	nb, nr := len(s.backends), len(s.runtimes)
	s.mu.Unlock()
	if nb != 0 || nr != 0 {
		t.Errorf("empty store still holds %d backends, %d runtimes; want 0, 0", nb, nr)
	}
}

func TestSubscribe(t *testing.T) {
	s := newTestStore(StoreOptions{})
	ch1, ch2 := s.Subscribe(), s.Subscribe()
	pending := func(ch <-chan struct{}) int {
		n := 0
		for {
			select {
			case <-ch:
				n++
			default:
				return n
			}
		}
	}
	if n := pending(ch1); n != 0 {
		t.Fatalf("before any publish: %d wake-ups, want 0", n)
	}
	mustUpdate(t, s, testService("a", 1))
	if n := pending(ch1); n != 1 {
		t.Errorf("after one publish: %d wake-ups, want 1", n)
	}
	// Three more publishes, including a failed one and a Replace, while
	// ch1 is not read: one wake-up.
	mustUpdate(t, s, testService("a", 2))
	if _, err := s.Update([]Service{{}}, nil); err == nil {
		t.Fatal("Update of an invalid service: no error")
	}
	if _, err := s.Replace(nil); err != nil {
		t.Fatal(err)
	}
	if n := pending(ch1); n != 1 {
		t.Errorf("after three unread publishes: %d wake-ups, want 1", n)
	}
	if n := pending(ch2); n != 1 {
		t.Errorf("second subscriber after four publishes: %d wake-ups, want 1", n)
	}
	if n := pending(ch1); n != 0 {
		t.Errorf("after draining: %d wake-ups, want 0", n)
	}
}

func TestBackendStatePersists(t *testing.T) {
	s := newTestStore(StoreOptions{})
	svc := testService("web", 2) // backends 0 and 1
	old := mustUpdate(t, s, svc).Balancer(svc.Name).Internal
	b0 := old.Backends()[0]
	b0.Acquire()
	b0.Acquire()
	b0.ReportFailure(t0)
	b1 := old.Backends()[1]
	b1.Acquire()

	// Backend 1 goes, backend 2 comes; backend 0 stays.
	svc.Endpoints = []Endpoint{{Addr: backendAddr(0), Ready: true}, {Addr: backendAddr(2), Ready: true}}
	svc.AffinityTimeout = time.Minute // any change of the Service
	cur := mustUpdate(t, s, svc).Balancer(svc.Name).Internal
	if got := cur.Backends()[0]; got != b0 {
		t.Fatalf("backend %v is a new *Backend after an Update that keeps it", b0.Addr)
	}
	if b0.Active() != 2 || b0.Failures() != 1 || !b0.CoolingDown(t0) {
		t.Errorf("kept backend: Active %d, Failures %d, cooling %v; want 2, 1, true", b0.Active(), b0.Failures(), b0.CoolingDown(t0))
	}
	if cur.Conns() != old.Conns() {
		t.Errorf("the Service's connection counter is new after an Update")
	}
	// A backend that went and came back starts afresh.
	svc.Endpoints = readyEndpoints(2)
	again := mustUpdate(t, s, svc).Balancer(svc.Name).Internal
	if nb1 := again.Backends()[1]; nb1 == b1 || nb1.Active() != 0 {
		t.Errorf("backend %v re-added: same *Backend %v, Active %d; want a fresh one with 0", b1.Addr, nb1 == b1, nb1.Active())
	}
	// The round-robin cursor lives on too: picks continue in turn across
	// the Update.
	var tried Tried
	first := again.Pick(clientAddr(1), &tried, t0.Add(time.Hour))
	svc.Port = 8080
	next := mustUpdate(t, s, svc).Balancer(svc.Name).Internal
	if second := next.Pick(clientAddr(2), &tried, t0.Add(time.Hour)); second == first {
		t.Errorf("round robin after an Update picked %v again, want the next backend", second.Addr)
	}
}

func TestBackendsSharedBetweenServices(t *testing.T) {
	s := newTestStore(StoreOptions{})
	x := testService("x", 2)
	y := testService("y", 0)
	y.ClusterIPs = []netip.Addr{clusterIP(2)}
	y.Endpoints = []Endpoint{{Addr: backendAddr(1), Ready: true}, {Addr: backendAddr(5), Ready: true}}
	u := testService("u", 2)
	u.Protocol = UDP
	snap := mustUpdate(t, s, x, y, u)

	bx := snap.Balancer(x.Name).Internal.Backends()[1]
	by := snap.Balancer(y.Name).Internal.Backends()[0]
	bu := snap.Balancer(u.Name).Internal.Backends()[1]
	if bx.Addr != backendAddr(1) || by.Addr != backendAddr(1) || bu.Addr != backendAddr(1) {
		t.Fatalf("test setup: got %v, %v, %v; want %v each", bx.Addr, by.Addr, bu.Addr, backendAddr(1))
	}
	if bx != by {
		t.Errorf("TCP %v in x and y: two *Backends, want one", bx.Addr)
	}
	if bu == bx || bu.Protocol != UDP {
		t.Errorf("UDP %v: shares the TCP *Backend %v, protocol %v; want its own UDP one", bu.Addr, bu == bx, bu.Protocol)
	}
	bx.Acquire()
	defer bx.Release()

	// x goes; y keeps the backend and its state.
	snap, err := s.Update(nil, []ServicePortName{x.Name})
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.Balancer(y.Name).Internal.Backends()[0]; got != by || got.Active() != 1 {
		t.Errorf("after deleting x: y's backend same %v, Active %d; want true, 1", got == by, got.Active())
	}
	// x comes back: it gets the same backend again.
	snap = mustUpdate(t, s, x)
	if got := snap.Balancer(x.Name).Internal.Backends()[1]; got != by {
		t.Errorf("x re-added: a new *Backend for %v, want y's", got.Addr)
	}
}

func TestHasEndpoint(t *testing.T) {
	s := newTestStore(StoreOptions{Node: Node{Name: "n1"}})
	svc := testService("web", 0)
	svc.InternalTrafficPolicy = PolicyLocal
	svc.Endpoints = []Endpoint{
		{Addr: backendAddr(1), Ready: true, NodeName: "n1"},
		{Addr: backendAddr(2), Ready: true, NodeName: "n2"},            // not usable here (Local)
		{Addr: backendAddr(3), Terminating: true, NodeName: "n1"},      // not usable at all
		{Addr: netip.MustParseAddrPort("[::ffff:10.1.0.4]:8080")},      // stored unmapped
		{Addr: netip.MustParseAddrPort("[fd00::4]:8080"), Ready: true}, // IPv6
	}
	snap := mustUpdate(t, s, svc)
	for _, tc := range []struct {
		name ServicePortName
		addr string
		want bool
	}{
		{svc.Name, "10.1.0.1:8080", true},
		{svc.Name, "10.1.0.2:8080", true},
		{svc.Name, "10.1.0.3:8080", true},
		{svc.Name, "10.1.0.4:8080", true},
		{svc.Name, "[fd00::4]:8080", true},
		{svc.Name, "10.1.0.1:8081", false},
		{svc.Name, "10.1.0.9:8080", false},
		{nameOf("other"), "10.1.0.1:8080", false},
	} {
		t.Run(tc.name.String()+"/"+tc.addr, func(t *testing.T) {
			if got := snap.HasEndpoint(tc.name, netip.MustParseAddrPort(tc.addr)); got != tc.want {
				t.Errorf("HasEndpoint(%v, %s) = %v, want %v", tc.name, tc.addr, got, tc.want)
			}
		})
	}
}

func TestBalancersSorted(t *testing.T) {
	names := []ServicePortName{
		{"ns-b", "x", ""},
		{"ns-a", "y", "http"},
		{"ns-a", "x", "p2"},
		{"ns-a", "x", ""},
		{"ns-a", "x", "p1"},
		{"ns-a", "xa", ""},
	}
	s := newTestStore(StoreOptions{})
	var svcs []Service
	for i, n := range names {
		svc := testService("", 1)
		svc.Name = n
		svc.ClusterIPs = []netip.Addr{clusterIP(i)}
		svcs = append(svcs, svc)
	}
	snap := mustUpdate(t, s, svcs...)
	var got []string
	for _, b := range snap.Balancers() {
		got = append(got, b.Service.Name.String())
	}
	want := []string{"ns-a/x", "ns-a/x:p1", "ns-a/x:p2", "ns-a/xa", "ns-a/y:http", "ns-b/x"}
	if !slices.Equal(got, want) {
		t.Errorf("Balancers() = %v, want %v", got, want)
	}
	if snap.Len() != len(want) {
		t.Errorf("Len() = %d, want %d", snap.Len(), len(want))
	}
	for _, n := range names {
		if b := snap.Balancer(n); b == nil || b.Service.Name != n {
			t.Errorf("Balancer(%v) = %v, want it", n, b)
		}
	}
}

func TestDefaultAlgorithm(t *testing.T) {
	for _, tc := range []struct {
		storeDefault, service, want Algorithm
	}{
		{AlgorithmDefault, AlgorithmDefault, RoundRobin},
		{Maglev, AlgorithmDefault, Maglev},
		{Maglev, Random, Random},
		{AlgorithmDefault, LeastConn, LeastConn},
	} {
		t.Run(tc.storeDefault.String()+"/"+tc.service.String(), func(t *testing.T) {
			s := newTestStore(StoreOptions{DefaultAlgorithm: tc.storeDefault})
			svc := testService("web", 3)
			svc.Algorithm = tc.service
			svc.ExternalTrafficPolicy = PolicyLocal // separate external pool
			bal := mustUpdate(t, s, svc).Balancer(svc.Name)
			if got := bal.Internal.Algorithm(); got != tc.want {
				t.Errorf("internal pool algorithm = %v, want %v", got, tc.want)
			}
			if got := bal.External.Algorithm(); got != tc.want {
				t.Errorf("external pool algorithm = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestParseAlgorithm(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Algorithm
		name string // want.String()
		err  bool
	}{
		{in: "", want: AlgorithmDefault, name: "default"},
		{in: "rr", want: RoundRobin, name: "round-robin"},
		{in: "Round-Robin", want: RoundRobin, name: "round-robin"},
		{in: "random", want: Random, name: "random"},
		{in: "LC", want: LeastConn, name: "least-conn"},
		{in: "least-conn", want: LeastConn, name: "least-conn"},
		{in: "maglev", want: Maglev, name: "maglev"},
		{in: "mh", want: Maglev, name: "maglev"},
		{in: "wrr", err: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseAlgorithm(tc.in)
			if tc.err {
				if err == nil {
					t.Errorf("ParseAlgorithm(%q) = %v, nil; want an error", tc.in, got)
				}
				return
			}
			if err != nil || got != tc.want || got.String() != tc.name {
				t.Errorf("ParseAlgorithm(%q) = %v (%q), %v; want %v (%q), nil", tc.in, got, got.String(), err, tc.want, tc.name)
			}
		})
	}
}

func TestParseProtocol(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Protocol
		err  bool
	}{
		{in: "", want: TCP},
		{in: "tcp", want: TCP},
		{in: "UDP", want: UDP},
		{in: "Udp", want: UDP},
		{in: "SCTP", want: SCTP},
		{in: "sctp", want: SCTP},
		{in: "DCCP", err: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseProtocol(tc.in)
			if tc.err {
				if err == nil {
					t.Errorf("ParseProtocol(%q) = %v, nil; want an error", tc.in, got)
				}
				return
			}
			if err != nil || got != tc.want || (tc.in != "" && got.String() != strings.ToUpper(tc.in)) {
				t.Errorf("ParseProtocol(%q) = %v, %v; want %v, nil", tc.in, got, err, tc.want)
			}
		})
	}
}

// TestSetNode: a new zone decides the hinted Services again in one publish;
// backends keep their state; Services the zone cannot affect keep their
// Balancer; a new node name re-decides Local policies; the same node
// publishes nothing.
func TestSetNode(t *testing.T) {
	hinted := testService("hinted", 0)
	hinted.Endpoints = []Endpoint{
		{Addr: backendAddr(0), Ready: true, Serving: true, NodeName: "n1", ZoneHints: []string{"z1"}},
		{Addr: backendAddr(1), Ready: true, Serving: true, NodeName: "n2", ZoneHints: []string{"z2"}},
	}
	plain := testService("plain", 2)
	plain.ClusterIPs = []netip.Addr{clusterIP(2)}
	local := testService("local", 0)
	local.ClusterIPs = []netip.Addr{clusterIP(3)}
	local.InternalTrafficPolicy = PolicyLocal
	local.Endpoints = []Endpoint{{Addr: backendAddr(2), Ready: true, Serving: true, NodeName: "n1"}}

	s := newTestStore(StoreOptions{Node: Node{Name: "n1", Zone: "z1"}})
	before := mustUpdate(t, s, hinted, plain, local)
	backends := func(snap *Snapshot, name string) []netip.AddrPort {
		var out []netip.AddrPort
		for _, b := range snap.Balancer(nameOf(name)).Internal.Backends() {
			out = append(out, b.Addr)
		}
		return out
	}
	if got := backends(before, "hinted"); !slices.Equal(got, []netip.AddrPort{backendAddr(0)}) {
		t.Fatalf("zone z1: hinted backends %v, want %v", got, backendAddr(0))
	}
	failed := before.Balancer(nameOf("hinted")).Internal.Backends()[0]
	failed.ReportFailure(t0)

	if snap, err := s.SetNode(Node{Name: "n1", Zone: "z1"}); err != nil || snap != before {
		t.Errorf("SetNode(same node) = v%d, %v; want the current snapshot v%d, no publish", snap.Version, err, before.Version)
	}
	after, err := s.SetNode(Node{Name: "n1", Zone: "z2"})
	if err != nil {
		t.Fatal(err)
	}
	if after.Version != before.Version+1 || s.Node() != (Node{Name: "n1", Zone: "z2"}) {
		t.Errorf("after SetNode: version %d, node %+v; want %d, zone z2", after.Version, s.Node(), before.Version+1)
	}
	if got := backends(after, "hinted"); !slices.Equal(got, []netip.AddrPort{backendAddr(1)}) {
		t.Errorf("zone z2: hinted backends %v, want %v", got, backendAddr(1))
	}
	if after.Balancer(nameOf("plain")) != before.Balancer(nameOf("plain")) || after.Balancer(nameOf("local")) != before.Balancer(nameOf("local")) {
		t.Error("a zone change rebuilt Balancers it cannot affect")
	}
	back, _ := s.SetNode(Node{Name: "n1", Zone: "z1"})
	if b := back.Balancer(nameOf("hinted")).Internal.Backends()[0]; b != failed || b.Failures() != 1 {
		t.Errorf("back in z1: backend %p with %d failures, want the same %p with its 1 failure", b, b.Failures(), failed)
	}
	moved, _ := s.SetNode(Node{Name: "n2", Zone: "z1"})
	if got := backends(moved, "local"); len(got) != 0 {
		t.Errorf("on node n2: Local backends %v, want none (the endpoint is on n1)", got)
	}
}
