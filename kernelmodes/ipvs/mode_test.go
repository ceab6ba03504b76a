package ipvs_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs/internal/cases"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs/ipvstest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
)

// TestServiceSemantics runs the shared Service table (the one the VM test
// runs against a real kernel) through the tracer, with incremental and with
// full syncs.
func TestServiceSemantics(t *testing.T) {
	for _, full := range []bool{false, true} {
		name := "incremental"
		if full {
			name = "full"
		}
		t.Run(name, func(t *testing.T) {
			w := newWorld(t, ipvs.Config{})
			for _, step := range cases.Steps() {
				t.Run(step.Name, func(t *testing.T) { w.runStep(t, step, full) })
			}
			if err := w.m.Cleanup(context.Background()); err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			w.checkClean(t)
			v := w.f.Trace(w.packet(cases.Pod, lb.TCP, cases.StickyIP))
			if v.Action != ipvstest.Untouched {
				t.Errorf("after Cleanup, pod -> %v: %v, want Untouched", cases.StickyIP, v)
			}
		})
	}
}

func (w *world) runStep(t *testing.T, step cases.Step, full bool) {
	var held *ipvstest.Conn
	var heldPkt ipvstest.Packet
	if h := step.Held; h != nil {
		for range 10 {
			heldPkt = w.packet(h.From, h.Proto, h.To)
			c := w.f.Connect(heldPkt)
			if c.Route.Action == ipvstest.Forwarded && c.Route.Backend.Addr() == cases.Backends[h.Backend] {
				held = c
				break
			}
			c.Close()
		}
		if held == nil {
			t.Fatalf("could not open a connection to backend%d through %v", h.Backend, h.To)
		}
	}
	var fam netfilter.Family // the held flow's
	if h := step.Held; h != nil {
		fam = netfilter.FamilyOf(cases.Backends[h.Backend])
	}
	before := w.m.ConntrackDeleted(fam)
	if _, err := w.store.Replace(step.Services); err != nil {
		t.Fatalf("Replace: %v", err)
	}
	if err := w.m.Apply(context.Background(), w.store.Snapshot(), full); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if h := step.Held; h != nil && h.Proto == lb.UDP && w.m.ConntrackDeleted(fam) == before {
		t.Errorf("ConntrackDeleted(%v) did not count the held flow's entry, deleted with its real server", fam)
	}
	if h := step.Held; h != nil {
		gone := netip.AddrPortFrom(cases.Backends[h.Backend], held.Route.Backend.Port())
		rs := w.realServers(h.Proto, h.To)
		if h.Proto == lb.UDP {
			if slices.ContainsFunc(rs, func(s string) bool { return strings.HasPrefix(s, gone.String()+" ") }) {
				t.Errorf("removed UDP real server %v is still there: %v", gone, rs)
			}
			v := w.f.Trace(heldPkt)
			if v.Action != ipvstest.Forwarded || v.Backend == gone {
				t.Errorf("the held flow's next datagram: %v, want it forwarded to another backend", v)
			}
		} else {
			if !slices.Contains(rs, gone.String()+" w0") {
				t.Errorf("real servers of %v: %v, want %v draining at weight 0", h.To, rs, gone)
			}
			if w.m.Draining() == 0 {
				t.Errorf("Draining() = 0 with a held connection")
			}
		}
	}
	for _, p := range step.Probes {
		if msg := cases.Check(p, w.probe(p)); msg != "" {
			t.Errorf("%s (%v -> %s/%v): %s", p.Name, p.From, netfilter.ProtoName(p.Proto), p.To, msg)
		}
	}
	if h := step.Held; h != nil && h.Proto == lb.TCP {
		held.Close()
		if err := w.m.Sweep(context.Background()); err != nil {
			t.Fatalf("Sweep: %v", err)
		}
		gone := be(h.Backend)
		if rs := w.realServers(h.Proto, h.To); slices.ContainsFunc(rs, func(s string) bool { return strings.HasPrefix(s, gone.String()+" ") }) {
			t.Errorf("after its connection ended and a sweep, real servers of %v: %v, want %v deleted", h.To, rs, gone)
		}
		if w.m.Draining() != 0 {
			t.Errorf("Draining() = %d after the sweep", w.m.Draining())
		}
	}
}

// checkClean asserts nothing of svcproxy's is left in the fake kernel.
func (w *world) checkClean(t *testing.T) {
	t.Helper()
	if vs := w.f.IPVS.Services(); len(vs) != 0 {
		t.Errorf("virtual servers left: %v", vs)
	}
	if _, _, ok := w.f.Links.Link(ipvs.DummyInterface); ok {
		t.Errorf("%s left", ipvs.DummyInterface)
	}
	if left := w.f.RulesLeft(); len(left) > 0 {
		t.Errorf("rules or sets left:\n%s", strings.Join(left, "\n"))
	}
}

func TestIdempotentApplyMakesNoCalls(t *testing.T) {
	w := newWorld(t, ipvs.Config{})
	svcs := []lb.Service{cases.Web(0, 1), cases.DNS(0, 1), cases.Sticky()}
	w.apply(false, svcs...)
	w.f.ResetCalls()
	w.apply(false, svcs...)
	if calls := w.f.Calls(); len(calls) != 0 {
		t.Errorf("second Apply made %d kernel calls, want none: %v", len(calls), calls)
	}
	// A full Apply of the same reads everything but changes nothing but
	// the rewrite of its own chains.
	w.apply(true, svcs...)
	before := dump(w.f)
	w.f.ResetCalls()
	w.apply(true, svcs...)
	for _, c := range w.f.Calls() {
		op, _, _ := strings.Cut(c, " ")
		switch op {
		case "GetServices", "GetDestinations", "EnsureDummy", "Addrs", "NodeAddrs", "ipset-save", "iptables-save", "iptables-restore", "Sysctl":
		default:
			t.Errorf("an unchanged full Apply called %q", c)
		}
	}
	if after := dump(w.f); after != before {
		t.Errorf("an unchanged full Apply changed the kernel:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if w.m.Repairs() != 0 {
		t.Errorf("Repairs() = %d, want 0", w.m.Repairs())
	}
}

func TestVirtualServers(t *testing.T) {
	w := newWorld(t, ipvs.Config{})
	w.f.Links.AddNodeAddr("eth1", netip.MustParseAddr("192.0.2.7"))
	w.apply(false, cases.Web(0, 1), cases.Sticky())
	checkVirtualServers(t, virtualServers(w.f, func(ipvstest.VirtualServer) bool { return true }), []string{
		"tcp 192.0.2.7:30080 rr -> 198.18.2.1:8080 w1 -> 198.18.2.2:8080 w1",
		"tcp 198.18.0.1:30080 rr -> 198.18.2.1:8080 w1 -> 198.18.2.2:8080 w1",
		"tcp 198.19.0.10:80 rr -> 198.18.2.1:8080 w1 -> 198.18.2.2:8080 w1",
		"tcp 198.19.0.11:80 rr persistent 10800 -> 198.18.2.1:8080 w1 -> 198.18.2.2:8080 w1 -> 198.18.2.3:8080 w1",
		"tcp 198.19.1.10:80 rr -> 198.18.2.1:8080 w1 -> 198.18.2.2:8080 w1",
		"tcp 198.19.2.10:80 rr -> 198.18.2.1:8080 w1 -> 198.18.2.2:8080 w1",
	})
	_, addrs, _ := w.f.Links.Link(ipvs.DummyInterface)
	slices.SortFunc(addrs, netip.Addr.Compare)
	if g, w := fmtAddrs(addrs), "198.19.0.10 198.19.0.11 198.19.1.10 198.19.2.10"; g != w {
		t.Errorf("%s addresses: %s, want %s", ipvs.DummyInterface, g, w)
	}
	vals := w.f.Sysctls.Values()
	for _, s := range ipvs.Parameters(ipvs.KernelRelease()) {
		if vals[s[0]] != s[1] {
			t.Errorf("sysctl %s = %q, want %q", s[0], vals[s[0]], s[1])
		}
	}
	// The second node address serves the NodePort too.
	v := w.f.Trace(ipvstest.Packet{Src: netip.MustParseAddrPort("203.0.113.9:5555"), Dst: netip.MustParseAddrPort("192.0.2.7:30080"), Proto: lb.TCP})
	if v.Action != ipvstest.Forwarded || !v.Masquerade {
		t.Errorf("external client -> second node IP NodePort: %v, want forwarded and masqueraded", v)
	}
}

func TestSchedulers(t *testing.T) {
	for _, sched := range ipvs.Schedulers {
		t.Run(sched, func(t *testing.T) {
			w := newWorld(t, ipvs.Config{Scheduler: sched})
			w.apply(false, cases.Web(0, 1, 2))
			for _, v := range w.f.IPVS.Services() {
				if v.Scheduler != sched {
					t.Errorf("%v: scheduler %q, want %q", v.Addr, v.Scheduler, sched)
				}
			}
			// Source hashing keeps a client on one backend; round robin
			// spreads it.
			p := cases.Probe{From: cases.Pod, To: cases.WebClusterIP, N: 6, Backends: []int{0, 1, 2}}
			switch sched {
			case "sh", "mh", "dh":
				p.Sticky = true
			case "rr", "wrr":
				p.Balanced = true
			}
			if msg := cases.Check(p, w.probe(p)); msg != "" {
				t.Error(msg)
			}
		})
	}
	if _, err := ipvs.New(ipvs.Config{Scheduler: "random"}); err == nil {
		t.Error("New accepted an unknown scheduler")
	}
	// A Service naming an algorithm gets the matching scheduler.
	w := newWorld(t, ipvs.Config{Scheduler: "wlc"})
	named := func(name string, a lb.Algorithm, ip string) lb.Service {
		s := cases.Web(0)
		s.Name.Name, s.Algorithm, s.NodePort = name, a, 0
		s.ClusterIPs, s.ExternalIPs, s.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr(ip)}, nil, nil
		return s
	}
	w.apply(false, named("a", lb.RoundRobin, "198.19.9.1"), named("b", lb.LeastConn, "198.19.9.2"),
		named("c", lb.Maglev, "198.19.9.3"), named("d", lb.Random, "198.19.9.4"), named("e", lb.AlgorithmDefault, "198.19.9.5"))
	var got []string
	for _, v := range w.f.IPVS.Services() {
		got = append(got, v.Addr.Addr().String()+" "+v.Scheduler)
	}
	want := []string{"198.19.9.1 rr", "198.19.9.2 lc", "198.19.9.3 mh", "198.19.9.4 wlc", "198.19.9.5 wlc"}
	if !slices.Equal(got, want) {
		t.Errorf("schedulers: %v, want %v", got, want)
	}
}

func TestAffinityIsPersistence(t *testing.T) {
	w := newWorld(t, ipvs.Config{})
	sticky := cases.Sticky()
	sticky.AffinityTimeout = 90 * time.Second
	w.apply(false, sticky)
	vs := w.f.IPVS.Services()
	if len(vs) != 1 || !vs[0].Persistent || vs[0].Timeout != 90 {
		t.Fatalf("virtual servers %v, want one persistent with timeout 90", vs)
	}
	p := cases.Probe{From: cases.Pod, To: cases.StickyIP, N: 5, Backends: []int{0, 1, 2}, Sticky: true}
	first := w.probe(p)
	if msg := cases.Check(p, first); msg != "" {
		t.Fatal(msg)
	}
	// Past the timeout, the client is scheduled afresh (round robin moves on).
	w.clock.Advance(91 * time.Second)
	p.N = 1
	if r := w.probe(p); r[0].Backend == first[0].Backend {
		t.Errorf("after the affinity timeout, still on backend%d", r[0].Backend)
	}
	// Turning affinity off updates the virtual server in place.
	sticky.AffinityTimeout = 0
	w.f.ResetCalls()
	w.apply(false, sticky)
	if calls := w.f.IPVS.Calls(); !slices.Equal(calls, []string{"UpdateService tcp/198.19.0.11:80"}) {
		t.Errorf("calls %v, want one UpdateService", calls)
	}
	if vs := w.f.IPVS.Services(); vs[0].Persistent {
		t.Errorf("still persistent: %v", vs[0])
	}
}

func TestDrainTimeout(t *testing.T) {
	w := newWorld(t, ipvs.Config{DrainTimeout: 30 * time.Second})
	w.apply(false, cases.Web(0, 1))
	var held *ipvstest.Conn
	for range 4 {
		c := w.f.Connect(w.packet(cases.Pod, lb.TCP, cases.WebClusterIP))
		if c.Route.Backend == be(1) {
			held = c
			break
		}
		c.Close()
	}
	if held == nil {
		t.Fatal("no connection to backend1")
	}
	defer held.Close()
	w.apply(false, cases.Web(0))
	if err := w.m.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rs := w.realServers(lb.TCP, cases.WebClusterIP); !slices.Contains(rs, be(1).String()+" w0") {
		t.Fatalf("real servers %v, want backend1 draining", rs)
	}
	w.clock.Advance(31 * time.Second)
	if err := w.m.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rs := w.realServers(lb.TCP, cases.WebClusterIP); len(rs) != 1 {
		t.Errorf("after the drain timeout, real servers %v, want backend1 deleted", rs)
	}
	// Sweeping with nothing draining touches nothing.
	w.f.ResetCalls()
	if err := w.m.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if calls := w.f.Calls(); len(calls) != 0 {
		t.Errorf("idle Sweep made calls: %v", calls)
	}
}

func TestDrainingEndpointComesBack(t *testing.T) {
	w := newWorld(t, ipvs.Config{})
	w.apply(false, cases.Web(0, 1))
	if err := w.f.IPVS.SetConns(lb.TCP, cases.WebClusterIP, be(1), 0, 3); err != nil {
		t.Fatal(err)
	}
	w.apply(false, cases.Web(0))
	if rs := w.realServers(lb.TCP, cases.WebClusterIP); !slices.Contains(rs, be(1).String()+" w0") {
		t.Fatalf("real servers %v, want backend1 draining (3 inactive connections)", rs)
	}
	w.apply(false, cases.Web(0, 1))
	if rs := w.realServers(lb.TCP, cases.WebClusterIP); !slices.Contains(rs, be(1).String()+" w1") {
		t.Errorf("real servers %v, want backend1 back at weight 1", rs)
	}
	if w.m.Draining() != 0 {
		t.Errorf("Draining() = %d", w.m.Draining())
	}
}

func TestMasquerade(t *testing.T) {
	localOf := func(s lb.Service) lb.Service {
		s.ExternalTrafficPolicy = lb.PolicyLocal
		for i := range s.Endpoints {
			s.Endpoints[i].NodeName = nodeName
		}
		return s
	}
	local := func() lb.Service { return localOf(cases.Web(0, 1)) }
	for _, tc := range []struct {
		name string
		cfg  ipvs.Config
		svc  lb.Service
		to   netip.AddrPort
		want bool
	}{
		{"ClusterIP", ipvs.Config{}, cases.Web(0, 1), cases.WebClusterIP, false},
		{"ClusterIP, masquerade all", ipvs.Config{MasqueradeAll: true}, cases.Web(0, 1), cases.WebClusterIP, true},
		{"NodePort, Local policy, masquerade all", ipvs.Config{MasqueradeAll: true}, local(), cases.WebNodePort, false},
		{"ExternalIP, Local policy, masquerade all", ipvs.Config{MasqueradeAll: true}, local(), cases.WebExternalIP, false},
		{"LoadBalancer IP, masquerade all", ipvs.Config{MasqueradeAll: true}, cases.Web(0, 1), cases.WebLBIP, true},
		{"NodePort", ipvs.Config{}, cases.Web(0, 1), cases.WebNodePort, true},
		{"NodePort, Local policy", ipvs.Config{}, local(), cases.WebNodePort, false},
		{"ExternalIP, Local policy", ipvs.Config{}, local(), cases.WebExternalIP, false},
		{"LoadBalancer IP", ipvs.Config{}, cases.Web(0, 1), cases.WebLBIP, true},
		// SCTP NodePorts have sets of their own (node IP, port members).
		{"SCTP NodePort, masquerade all", ipvs.Config{MasqueradeAll: true}, cases.Diameter(0, 1), cases.SCTPNodePort, true},
		{"SCTP NodePort, Local policy, masquerade all", ipvs.Config{MasqueradeAll: true}, localOf(cases.Diameter(0, 1)), cases.SCTPNodePort, false},
		{"SCTP ClusterIP, masquerade all", ipvs.Config{MasqueradeAll: true}, localOf(cases.Diameter(0, 1)), cases.SCTPClusterIP, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, tc.cfg)
			w.apply(false, tc.svc)
			v := w.f.Trace(w.packet(cases.Pod, tc.svc.Protocol, tc.to))
			if v.Action != ipvstest.Forwarded || v.Masquerade != tc.want {
				t.Errorf("pod -> %v: %v, want forwarded, masquerade %v", tc.to, v, tc.want)
			}
		})
	}
}

func TestFullSyncRepairsTampering(t *testing.T) {
	svcs := []lb.Service{cases.Web(0, 1), cases.DNS(0, 1), cases.Sticky()}
	ref := newWorld(t, ipvs.Config{})
	ref.apply(true, svcs...)

	w := newWorld(t, ipvs.Config{})
	w.apply(false, svcs...)
	foreign := ipvs.VirtualService(lb.TCP, netip.MustParseAddrPort("10.0.0.1:80"), "rr")
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// Someone else's virtual server, on an address that is not ours: kept.
	must(w.f.IPVS.NewService(foreign))
	// Ours, tampered with.
	web := ipvs.VirtualService(lb.TCP, cases.WebClusterIP, "rr")
	must(w.f.IPVS.DelService(ipvs.VirtualService(lb.TCP, cases.WebExternalIP, "rr")))
	must(w.f.IPVS.UpdateDestination(web, ipvs.RealServer(be(0), 5)))
	must(w.f.IPVS.NewDestination(web, ipvs.RealServer(be(2), 1)))
	must(w.f.IPVS.UpdateService(ipvs.VirtualService(lb.TCP, cases.StickyIP, "lc")))
	stray := ipvs.VirtualService(lb.TCP, netip.AddrPortFrom(cases.WebClusterIP.Addr(), 8443), "rr")
	must(w.f.IPVS.NewService(stray))
	must(w.f.Links.DelAddr(ctx, ipvs.DummyInterface, cases.WebLBIP.Addr()))
	must(w.f.Links.AddAddr(ctx, ipvs.DummyInterface, netip.MustParseAddr("198.19.7.7")))
	must(w.f.Rules.IPSetRestore(ctx, []byte("del svcproxy-ipvs-vs-v4 198.19.0.10,tcp:80\nadd svcproxy-ipvs-reject-v4 198.19.0.11,tcp:80\ncreate svcproxy-ipvs-junk hash:ip\n")))
	must(w.f.Rules.IPTablesRestore(ctx, ipvs.IPv4, []byte("*nat\n:SVCPROXY-IPVS-JUNK - [0:0]\n-D PREROUTING -j SVCPROXY-IPVS-SERVICES\n-A OUTPUT -j SVCPROXY-IPVS-SERVICES\nCOMMIT\n*filter\n-F SVCPROXY-IPVS-FILTER\nCOMMIT\n")))

	// An incremental Apply trusts its memory...
	w.apply(false, svcs...)
	if w.m.Repairs() != 0 {
		t.Errorf("Repairs() = %d after an incremental Apply", w.m.Repairs())
	}
	// ... a full one repairs everything and prunes what is ours.
	w.apply(true, svcs...)
	if w.m.Repairs() != 1 {
		t.Errorf("Repairs() = %d, want 1", w.m.Repairs())
	}
	must(w.f.IPVS.DelService(foreign))
	if got, want := dump(w.f), dump(ref.f); got != want {
		t.Errorf("after the repair:\n%s\nwant (a fresh Apply):\n%s", got, want)
	}
	// A second full sync finds nothing to repair.
	w.apply(true, svcs...)
	if w.m.Repairs() != 1 {
		t.Errorf("Repairs() = %d after a clean full sync, want still 1", w.m.Repairs())
	}
}

func TestCleanupLeavesOthersAlone(t *testing.T) {
	w := newWorld(t, ipvs.Config{})
	ctx := context.Background()
	foreignRules := "*nat\n:FOREIGN - [0:0]\n-A PREROUTING -j FOREIGN\n-A FOREIGN -p tcp --dport 8080 -j RETURN\nCOMMIT\n*filter\n-A INPUT -p tcp --dport 22 -j ACCEPT\nCOMMIT\n"
	if err := w.f.Rules.IPSetRestore(ctx, []byte("create foreign hash:ip\nadd foreign 10.1.1.1\n")); err != nil {
		t.Fatal(err)
	}
	if err := w.f.Rules.IPTablesRestore(ctx, ipvs.IPv4, []byte(foreignRules)); err != nil {
		t.Fatal(err)
	}
	foreign := ipvs.VirtualService(lb.UDP, netip.MustParseAddrPort("10.0.0.1:53"), "rr")
	if err := w.f.IPVS.NewService(foreign); err != nil {
		t.Fatal(err)
	}
	before := dump(w.f)
	w.apply(false, cases.Web(0, 1), cases.DNS(0, 1), cases.Sticky())
	if c := w.f.Connect(w.packet(cases.Pod, lb.UDP, cases.DNSClusterIP)); c.Route.Action != ipvstest.Forwarded {
		t.Fatalf("a UDP flow to the DNS Service: %v", c.Route)
	}
	w.f.Conntrack.ResetCalls()
	if err := w.m.Cleanup(ctx); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if after := dump(w.f); after != before {
		t.Errorf("after Cleanup:\n%s\nwant what was there before:\n%s", after, before)
	}
	if calls, flows := w.f.Conntrack.Calls(), w.f.Conntrack.Flows(); !slices.Equal(calls, []string{"Delete IPv4"}) || len(flows) != 0 {
		t.Errorf("conntrack calls %v leave %v, want the UDP Service's flows cleared in one read", calls, flows)
	}
	// Cleanup twice is fine; Apply afterwards starts afresh.
	if err := w.m.Cleanup(ctx); err != nil {
		t.Fatalf("second Cleanup: %v", err)
	}
	w.apply(false, cases.Web(0, 1))
	if v := w.f.Trace(w.packet(cases.Pod, lb.TCP, cases.WebClusterIP)); v.Action != ipvstest.Forwarded {
		t.Errorf("after Cleanup and Apply: %v", v)
	}
	// A Mode that never applied cleans up what another left.
	other := newWorldOn(t, w.f, w.clock, ipvs.Config{})
	if err := other.m.Cleanup(ctx); err != nil {
		t.Fatalf("Cleanup by a new Mode: %v", err)
	}
	if after := dump(w.f); after != before {
		t.Errorf("after Cleanup by a new Mode:\n%s\nwant:\n%s", after, before)
	}
}

func TestRestartAdoptsState(t *testing.T) {
	w := newWorld(t, ipvs.Config{})
	w.apply(false, cases.Web(0, 1), cases.DNS(0, 1))
	if err := w.f.IPVS.SetConns(lb.TCP, cases.WebClusterIP, be(1), 1, 0); err != nil {
		t.Fatal(err)
	}
	// A new process: its first Apply is a full one against the kernel. The
	// removed endpoint with a connection drains; the removed Service goes.
	w2 := newWorldOn(t, w.f, w.clock, ipvs.Config{})
	w2.f.ResetCalls()
	w2.apply(false, cases.Web(0))
	if rs := w2.realServers(lb.TCP, cases.WebClusterIP); !slices.Equal(rs, []string{be(0).String() + " w1", be(1).String() + " w0"}) {
		t.Errorf("real servers %v, want backend1 draining", rs)
	}
	if rs := w2.realServers(lb.TCP, cases.WebExternalIP); !slices.Equal(rs, []string{be(0).String() + " w1"}) {
		t.Errorf("ExternalIP real servers %v, want backend1 (no connections) deleted", rs)
	}
	if rs := w2.realServers(lb.UDP, cases.DNSClusterIP); rs != nil {
		t.Errorf("removed UDP Service still has a virtual server: %v", rs)
	}
	if err := w.f.IPVS.SetConns(lb.TCP, cases.WebClusterIP, be(1), 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := w2.m.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rs := w2.realServers(lb.TCP, cases.WebClusterIP); len(rs) != 1 {
		t.Errorf("after the sweep: %v", rs)
	}
	if w2.m.Repairs() != 0 {
		t.Errorf("a first full sync counted %d repairs", w2.m.Repairs())
	}
}

func TestFailedApplyConverges(t *testing.T) {
	for _, op := range []string{"NewService", "NewDestination", "UpdateDestination", "DelService", "ipset-restore", "AddAddr"} {
		t.Run(op, func(t *testing.T) {
			w := newWorld(t, ipvs.Config{})
			w.apply(false, cases.Web(0, 1), cases.DNS(0, 1))
			boom := errors.New("boom")
			switch op {
			case "ipset-restore":
				w.f.Rules.FailNext(op, boom)
			case "AddAddr":
				w.f.Links.FailNext(op, boom)
			default:
				w.f.IPVS.FailNext(op, boom)
			}
			next := []lb.Service{cases.Web(0, 2), cases.Sticky()} // touches every op
			if err := w.tryApply(false, next...); !errors.Is(err, boom) {
				t.Fatalf("Apply: %v, want the injected error", err)
			}
			w.apply(false, next...) // a full one, after the failure
			ref := newWorld(t, ipvs.Config{})
			ref.apply(false, next...)
			if got, want := dump(w.f), dump(ref.f); got != want {
				t.Errorf("after recovery:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// TestRestoreFailuresCounted: a failed iptables-restore of a sync is
// counted for its family (kube-proxy's
// kubeproxy_sync_proxy_rules_iptables_restore_failures_total); the next
// sync writes the rules.
func TestRestoreFailuresCounted(t *testing.T) {
	w := newWorld(t, ipvs.Config{})
	boom := errors.New("boom")
	w.f.Rules.FailNext("iptables-restore", boom)
	if err := w.tryApply(true, cases.Web(0, 1)); !errors.Is(err, boom) {
		t.Fatalf("Apply: %v, want the injected error", err)
	}
	if v4, v6 := w.m.RestoreFailures(ipvs.IPv4), w.m.RestoreFailures(ipvs.IPv6); v4 != 1 || v6 != 0 {
		t.Errorf("RestoreFailures IPv4 %d, IPv6 %d; want 1, 0", v4, v6)
	}
	w.apply(true, cases.Web(0, 1))
	if n := w.m.RestoreFailures(ipvs.IPv4); n != 1 {
		t.Errorf("after a good sync RestoreFailures(IPv4) = %d, want still 1", n)
	}
	if msg := cases.Check(cases.Probe{From: cases.Pod, To: cases.WebNodePort, N: 2, Backends: []int{0, 1}, Balanced: true, Masq: cases.MasqYes},
		w.probe(cases.Probe{From: cases.Pod, To: cases.WebNodePort, N: 2})); msg != "" {
		t.Errorf("after the retry: %s", msg)
	}
}

func TestIPv6(t *testing.T) {
	w := newWorld(t, ipvs.Config{IPv6: true})
	w.f.Links.AddNodeAddr("eth0", netip.MustParseAddr("2001:db8::1"))
	svc := cases.Web()
	svc.ClusterIPs = []netip.Addr{netip.MustParseAddr("fd00::10")}
	svc.ExternalIPs, svc.LoadBalancerIPs = nil, nil
	svc.Endpoints = []lb.Endpoint{
		{Addr: netip.MustParseAddrPort("[fd00:1::1]:8080"), Ready: true},
		{Addr: netip.MustParseAddrPort("[fd00:1::2]:8080"), Ready: true},
	}
	w.apply(false, svc)
	pod := netip.MustParseAddrPort("[fd00:2::5]:4000")
	v := w.f.Trace(ipvstest.Packet{Src: pod, Dst: netip.MustParseAddrPort("[fd00::10]:80"), Proto: lb.TCP})
	if v.Action != ipvstest.Forwarded || v.Masquerade {
		t.Errorf("pod -> IPv6 ClusterIP: %v", v)
	}
	v = w.f.Trace(ipvstest.Packet{Src: pod, Dst: netip.MustParseAddrPort("[2001:db8::1]:30080"), Proto: lb.TCP})
	if v.Action != ipvstest.Forwarded || !v.Masquerade {
		t.Errorf("pod -> IPv6 NodePort: %v, want forwarded, masqueraded", v)
	}
	v = w.f.Trace(ipvstest.Packet{Src: pod, Dst: netip.MustParseAddrPort("[fd00::10]:81"), Proto: lb.TCP})
	if v.Action != ipvstest.Rejected {
		t.Errorf("pod -> another port of the IPv6 ClusterIP: %v, want Rejected", v)
	}
	// Without IPv6, IPv6 frontends and node IPs are skipped.
	w4 := newWorld(t, ipvs.Config{})
	w4.f.Links.AddNodeAddr("eth0", netip.MustParseAddr("2001:db8::1"))
	w4.apply(false, svc)
	for _, vs := range w4.f.IPVS.Services() {
		if vs.Addr.Addr().Is6() {
			t.Errorf("IPv6 virtual server without IPv6: %v", vs)
		}
	}
}

func TestNodePortAddresses(t *testing.T) {
	w := newWorld(t, ipvs.Config{NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/24")}})
	w.f.Links.AddNodeAddr("eth1", netip.MustParseAddr("192.0.2.7"))
	w.apply(false, cases.Web(0))
	if rs := w.realServers(lb.TCP, netip.MustParseAddrPort("192.0.2.7:30080")); rs != nil {
		t.Errorf("NodePort on an address outside --nodeport-addresses: %v", rs)
	}
	if rs := w.realServers(lb.TCP, cases.WebNodePort); rs == nil {
		t.Errorf("no NodePort on %v", cases.WebNodePort)
	}
	w2 := newWorld(t, ipvs.Config{NodeIPs: []netip.Addr{netip.MustParseAddr("192.0.2.8")}})
	w2.apply(false, cases.Web(0))
	var got []string
	for _, v := range w2.f.IPVS.Services() {
		if v.Addr.Port() == 30080 {
			got = append(got, v.Addr.String())
		}
	}
	if !slices.Equal(got, []string{"192.0.2.8:30080"}) {
		t.Errorf("NodePorts with NodeIPs set: %v", got)
	}
}

func TestConfig(t *testing.T) {
	for _, cfg := range []ipvs.Config{
		{Scheduler: "fancy"},
		{NodePortAddresses: []netip.Prefix{{}}},
		{NodeIPs: []netip.Addr{netip.IPv4Unspecified()}},
		{DrainTimeout: -time.Second},
		{ExcludeCIDRs: []netip.Prefix{{}}},
		{Timeouts: ipvs.Timeouts{TimeoutTCP: -time.Second}},
		{Timeouts: ipvs.Timeouts{TimeoutTCPFin: 500 * time.Millisecond}},
		{Timeouts: ipvs.Timeouts{TimeoutUDP: time.Millisecond}},
		{Timeouts: ipvs.Timeouts{TimeoutTCP: 6000 * time.Hour}}, // over INT_MAX/HZ seconds at any HZ
	} {
		if _, err := ipvs.New(cfg); err == nil {
			t.Errorf("New(%+v) accepted it", cfg)
		}
	}
	m, err := ipvs.New(ipvs.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if m.Config().Mark != ipvs.DefaultMark || m.Config().Scheduler != "rr" {
		t.Errorf("defaults: mark %#x scheduler %q", m.Config().Mark, m.Config().Scheduler)
	}
	m, err = ipvs.New(ipvs.Config{Timeouts: ipvs.Timeouts{TimeoutTCP: 1500 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Config().Timeouts.TimeoutTCP; got != time.Second {
		t.Errorf("a TCP timeout of 1.5s became %v, want 1s (the kernel's whole seconds)", got)
	}
}

// TestTimeouts: Config.Timeouts are set by full syncs where they differ
// (ipvsadm --set), zero ones are left alone, and failing to set them does
// not fail the sync.
func TestTimeouts(t *testing.T) {
	sec := func(s int) time.Duration { return time.Duration(s) * time.Second }
	d := ipvstest.DefaultTimeouts()
	for _, tc := range []struct {
		name    string
		want    ipvs.Timeouts
		before  ipvs.Timeouts // what the kernel holds first (zero: its defaults)
		fail    string        // the call that fails once
		after   ipvs.Timeouts
		setCall string // the SetConfig made; "": none
	}{
		{name: "zero leaves all alone", after: d},
		{name: "all three", want: ipvs.Timeouts{TimeoutTCP: sec(3600), TimeoutTCPFin: sec(30), TimeoutUDP: sec(60)},
			after: ipvs.Timeouts{TimeoutTCP: sec(3600), TimeoutTCPFin: sec(30), TimeoutUDP: sec(60)}, setCall: "SetConfig tcp=1h0m0s tcp_fin=30s udp=1m0s"},
		{name: "only the one that differs", want: ipvs.Timeouts{TimeoutTCP: d.TimeoutTCP, TimeoutUDP: sec(10)},
			after: ipvs.Timeouts{TimeoutTCP: d.TimeoutTCP, TimeoutTCPFin: d.TimeoutTCPFin, TimeoutUDP: sec(10)}, setCall: "SetConfig tcp=0s tcp_fin=0s udp=10s"},
		{name: "already set", want: ipvs.Timeouts{TimeoutTCPFin: sec(5)}, before: ipvs.Timeouts{TimeoutTCPFin: sec(5)},
			after: ipvs.Timeouts{TimeoutTCP: d.TimeoutTCP, TimeoutTCPFin: sec(5), TimeoutUDP: d.TimeoutUDP}},
		{name: "set refused", want: ipvs.Timeouts{TimeoutTCP: sec(60)}, fail: "SetConfig", after: d, setCall: "SetConfig tcp=1m0s tcp_fin=0s udp=0s"},
		{name: "read refused", want: ipvs.Timeouts{TimeoutTCP: sec(60)}, fail: "GetConfig", after: d},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, ipvs.Config{Timeouts: tc.want})
			if tc.before != (ipvs.Timeouts{}) {
				if err := w.f.IPVS.SetConfig(&tc.before); err != nil {
					t.Fatal(err)
				}
			}
			if tc.fail != "" {
				w.f.IPVS.FailNext(tc.fail, syscall.EPERM)
			}
			w.f.ResetCalls()
			w.apply(false, cases.Web(0, 1)) // the first Apply is full; a refusal does not fail it
			var sets, gets []string
			for _, c := range w.f.IPVS.Calls() {
				if strings.HasPrefix(c, "SetConfig") {
					sets = append(sets, c)
				}
				if c == "GetConfig" {
					gets = append(gets, c)
				}
			}
			if tc.want == (ipvs.Timeouts{}) && len(gets) > 0 {
				t.Errorf("with no timeouts to set, the sync read them: %q", gets)
			}
			if want := []string{tc.setCall}; tc.setCall == "" && len(sets) > 0 || tc.setCall != "" && !slices.Equal(sets, want) {
				t.Errorf("calls %q, want %q", sets, tc.setCall)
			}
			if got := w.f.IPVS.Timeouts(); got != tc.after {
				t.Errorf("timeouts %+v, want %+v", got, tc.after)
			}
			if len(w.f.IPVS.Services()) == 0 {
				t.Error("no virtual servers")
			}
			if tc.want == (ipvs.Timeouts{}) || tc.fail == "" {
				return
			}
			// The next full sync sets them.
			w.apply(true, cases.Web(0, 1))
			if got := w.f.IPVS.Timeouts(); got.TimeoutTCP != tc.want.TimeoutTCP {
				t.Errorf("after a second full sync: timeouts %+v, want TCP %v", got, tc.want.TimeoutTCP)
			}
		})
	}
}

// TestTimeoutsRepaired: a full sync puts back timeouts someone changed; a
// partial one does not read them.
func TestTimeoutsRepaired(t *testing.T) {
	want := ipvs.Timeouts{TimeoutTCP: time.Hour, TimeoutUDP: time.Minute}
	w := newWorld(t, ipvs.Config{Timeouts: want})
	w.apply(false, cases.Web(0, 1))
	if err := w.f.IPVS.SetConfig(&ipvs.Timeouts{TimeoutTCP: 7 * time.Second}); err != nil {
		t.Fatal(err)
	}
	w.f.ResetCalls()
	w.apply(false, cases.Web(0, 1, 2))
	if c := w.f.IPVS.Calls(); slices.ContainsFunc(c, func(s string) bool { return strings.HasSuffix(s, "Config") || strings.HasPrefix(s, "SetConfig") }) {
		t.Errorf("a partial sync touched the timeouts: %q", c)
	}
	w.apply(true, cases.Web(0, 1, 2))
	if got := w.f.IPVS.Timeouts(); got.TimeoutTCP != time.Hour || got.TimeoutUDP != time.Minute {
		t.Errorf("after a full sync: timeouts %+v, want TCP 1h and UDP 1m", got)
	}
}

// TestTimeoutsWarnOnce: a failure to set the timeouts is warned about
// once, again when it changes, and again after they were set and fail
// anew; none of it fails a sync.
func TestTimeoutsWarnOnce(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	w := newWorld(t, ipvs.Config{Timeouts: ipvs.Timeouts{TimeoutTCP: time.Hour}, Logger: zap.New(core)})
	for i, step := range []struct {
		fail  string
		err   error
		warns int // so far
		set   bool
	}{
		{"SetConfig", syscall.EPERM, 1, false},
		{"SetConfig", syscall.EPERM, 1, false},
		{"GetConfig", syscall.EIO, 2, false},
		{"", nil, 2, true},
		{"", nil, 2, true},
	} {
		if step.fail != "" {
			w.f.IPVS.FailNext(step.fail, step.err)
		}
		w.apply(true, cases.Web(0, 1))
		if n := logs.FilterMessage("IPVS timeouts left as they are").Len(); n != step.warns {
			t.Errorf("step %d: %d warnings, want %d", i, n, step.warns)
		}
		if got := w.f.IPVS.Timeouts().TimeoutTCP == time.Hour; got != step.set {
			t.Errorf("step %d: TCP timeout set %v, want %v", i, got, step.set)
		}
	}
	// Changed behind its back and refused: warned again.
	if err := w.f.IPVS.SetConfig(&ipvs.Timeouts{TimeoutTCP: time.Minute}); err != nil {
		t.Fatal(err)
	}
	w.f.IPVS.FailNext("SetConfig", syscall.EPERM)
	w.apply(true, cases.Web(0, 1))
	if n := logs.FilterMessage("IPVS timeouts left as they are").Len(); n != 3 {
		t.Errorf("after a refusal that follows a success: %d warnings, want 3", n)
	}
}

// TestExcludeCIDRs: a virtual server of someone else's on an excluded
// address (a keepalived's on the node IP) survives syncs and Cleanup;
// without the exclusion a full sync prunes it, and Cleanup removes it, the
// node IP being one the NodePorts are served on, as kube-proxy's does.
// Virtual servers the Services ask for on an excluded address are made as
// any other, and removed when this Mode made them and they are no longer
// asked for; one a previous run left there stays, as with kube-proxy.
func TestExcludeCIDRs(t *testing.T) {
	ctx := context.Background()
	keepalived := netip.AddrPortFrom(cases.NodeIP, 443)
	addForeign := func(t *testing.T, w *world) {
		t.Helper()
		if err := w.f.IPVS.NewService(ipvs.VirtualService(lb.TCP, keepalived, "wlc")); err != nil {
			t.Fatal(err)
		}
	}
	nodeIP := []netip.Prefix{netip.PrefixFrom(cases.NodeIP, 32)}
	for _, tc := range []struct {
		name    string
		exclude []netip.Prefix
		kept    bool
	}{
		{"no exclusion", nil, false},
		{"the node IP excluded", nodeIP, true},
		{"the node IP excluded, IPv4-mapped", []netip.Prefix{netip.MustParsePrefix("::ffff:198.18.0.0/112")}, true},
		{"another range excluded", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, ipvs.Config{ExcludeCIDRs: tc.exclude})
			addForeign(t, w)
			w.apply(false, cases.Web(0, 1)) // the first Apply is full
			w.apply(true, cases.Web(0, 1))
			if got := hasVS(w, keepalived); got != tc.kept {
				t.Errorf("after full syncs, %v there: %v, want %v", keepalived, got, tc.kept)
			}
			if !hasVS(w, cases.WebNodePort) {
				t.Errorf("the NodePort's virtual server %v is missing", cases.WebNodePort)
			}
			if w.m.Repairs() != 0 {
				t.Errorf("Repairs() = %d, want 0", w.m.Repairs())
			}
			w.apply(false, cases.DNS(0))
			if hasVS(w, cases.WebNodePort) {
				t.Errorf("the removed Service's NodePort %v is still there", cases.WebNodePort)
			}
			w.apply(false, cases.Web(0, 1))
			if !tc.kept {
				addForeign(t, w)
			}
			if err := w.m.Cleanup(ctx); err != nil {
				t.Fatal(err)
			}
			if hasVS(w, cases.WebNodePort) {
				t.Errorf("after Cleanup, the NodePort %v is still there", cases.WebNodePort)
			}
			if got := hasVS(w, keepalived); got != tc.kept {
				t.Errorf("after Cleanup, %v there: %v, want %v", keepalived, got, tc.kept)
			}
		})
	}
	t.Run("left by a previous run", func(t *testing.T) {
		w := newWorld(t, ipvs.Config{ExcludeCIDRs: nodeIP})
		w.apply(false, cases.Web(0, 1))
		next := newWorldOn(t, w.f, w.clock, ipvs.Config{ExcludeCIDRs: nodeIP})
		next.apply(false, cases.DNS(0))
		if !hasVS(next, cases.WebNodePort) {
			t.Errorf("a NodePort on an excluded address that a previous run made was removed")
		}
		if hasVS(next, cases.WebClusterIP) {
			t.Errorf("a ClusterIP a previous run made was kept")
		}
		if err := newWorldOn(t, w.f, w.clock, ipvs.Config{ExcludeCIDRs: nodeIP}).m.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
		if !hasVS(next, cases.WebNodePort) {
			t.Errorf("Cleanup by a new Mode removed a NodePort on an excluded address")
		}
	})
	t.Run("left by a previous run that recorded it in the made file", func(t *testing.T) {
		made := filepath.Join(t.TempDir(), "made")
		cfg := ipvs.Config{ExcludeCIDRs: nodeIP, MadeFile: made}
		w := newWorld(t, cfg)
		addForeign(t, w)
		w.apply(false, cases.Web(0, 1))
		data, err := os.ReadFile(made)
		if err != nil {
			t.Fatal(err)
		}
		if want := "\ntcp " + cases.WebNodePort.String() + "\n"; !strings.Contains(string(data), want) || strings.Contains(string(data), keepalived.String()) {
			t.Errorf("made file:\n%s\nwant the NodePort on the excluded node IP (%v) alone", data, cases.WebNodePort)
		}
		next := newWorldOn(t, w.f, w.clock, cfg) // a restart, a handover, a rollout's new pod
		next.apply(false, cases.DNS(0))
		if hasVS(next, cases.WebNodePort) {
			t.Errorf("a NodePort on an excluded address that the previous run made and recorded was kept")
		}
		if !hasVS(next, keepalived) {
			t.Errorf("the foreign virtual server went")
		}
		if data, _ := os.ReadFile(made); strings.Contains(string(data), cases.WebNodePort.String()) {
			t.Errorf("the made file still lists the deleted NodePort:\n%s", data)
		}
		// Made and recorded, deleted behind its back as its Service goes
		// (a full sync finds it gone and drops it from the record), then
		// someone else's: not the next svcproxy's to delete.
		next.apply(false, cases.Web(0, 1))
		if err := next.f.IPVS.DelService(ipvs.VirtualService(lb.TCP, cases.WebNodePort, "rr")); err != nil {
			t.Fatal(err)
		}
		next.apply(true, cases.DNS(0))
		if err := next.f.IPVS.NewService(ipvs.VirtualService(lb.TCP, cases.WebNodePort, "wlc")); err != nil {
			t.Fatal(err)
		}
		third := newWorldOn(t, w.f, w.clock, cfg)
		third.apply(false, cases.DNS(0))
		third.apply(true, cases.DNS(0))
		if !hasVS(third, cases.WebNodePort) {
			t.Errorf("a virtual server someone else made where a recorded one was deleted was removed")
		}
		if err := newWorldOn(t, w.f, w.clock, cfg).m.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
		if !hasVS(third, keepalived) {
			t.Errorf("Cleanup removed the foreign virtual server")
		}
	})
	t.Run("two processes in a rollout share the made file", func(t *testing.T) {
		cfg := ipvs.Config{ExcludeCIDRs: nodeIP, MadeFile: filepath.Join(t.TempDir(), "made")}
		old := newWorld(t, cfg)
		old.apply(false, cases.Web(0, 1))
		next := newWorldOn(t, old.f, old.clock, cfg) // the new pod, while the old one still syncs
		next.apply(false, cases.Web(0, 1))
		old.apply(false, cases.Web(0, 1), cases.Diameter()) // the old one makes a NodePort meanwhile
		next.apply(true, cases.Web(0, 1), cases.Diameter()) // a full sync reads what the old one recorded
		next.apply(false, cases.Web(0, 1))                  // the old one is gone; Diameter goes
		if hasVS(next, cases.SCTPNodePort) {
			t.Errorf("a NodePort on an excluded address the old pod made during the rollout stayed after its Service went")
		}
	})
	t.Run("a record on a node IP missing at a full sync stays", func(t *testing.T) {
		cfg := ipvs.Config{ExcludeCIDRs: nodeIP, MadeFile: filepath.Join(t.TempDir(), "made")}
		w := newWorld(t, cfg)
		w.apply(false, cases.Web(0, 1))
		if err := w.f.Links.DelAddr(ctx, "eth0", cases.NodeIP); err != nil {
			t.Fatal(err)
		}
		next := newWorldOn(t, w.f, w.clock, cfg)
		next.apply(false, cases.Web(0, 1)) // full, without the node IP: its virtual servers are not read
		w.f.Links.AddNodeAddr("eth0", cases.NodeIP)
		next.apply(true, cases.DNS(0))
		if hasVS(next, cases.WebNodePort) {
			t.Errorf("a recorded NodePort on a node IP that was missing for a sync stayed after its Service went")
		}
	})
	t.Run("an unreadable made file", func(t *testing.T) {
		made := filepath.Join(t.TempDir(), "made")
		if err := os.WriteFile(made, []byte("tcp nonsense\nbogus\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		w := newWorld(t, ipvs.Config{ExcludeCIDRs: nodeIP, MadeFile: made})
		w.apply(false, cases.Web(0, 1))
		if data, _ := os.ReadFile(made); !strings.Contains(string(data), "tcp "+cases.WebNodePort.String()) || strings.Contains(string(data), "bogus") {
			t.Errorf("made file after a sync:\n%s\nwant it rewritten with the NodePort", data)
		}
	})
	// A Service asking for someone else's virtual server takes it over
	// (its real servers drain), by a full or a partial sync; once it
	// stops asking, the virtual server is left as it is, and no sync
	// counts a repair.
	foreignDest := netip.MustParseAddrPort("10.9.9.9:80")
	for _, full := range []bool{true, false} {
		t.Run(fmt.Sprintf("taken over by a sync with full=%v", full), func(t *testing.T) {
			w := newWorld(t, ipvs.Config{ExcludeCIDRs: nodeIP})
			svc := ipvs.VirtualService(lb.TCP, cases.WebNodePort, "wlc")
			if err := w.f.IPVS.NewService(svc); err != nil {
				t.Fatal(err)
			}
			if err := w.f.IPVS.NewDestination(svc, ipvs.RealServer(foreignDest, 1)); err != nil {
				t.Fatal(err)
			}
			if err := w.f.IPVS.SetConns(lb.TCP, cases.WebNodePort, foreignDest, 1, 0); err != nil {
				t.Fatal(err) // a connection open: it drains rather than goes
			}
			w.apply(false, cases.DNS(0)) // full: not asked for, left alone
			w.apply(full, cases.DNS(0), cases.Web(0, 1))
			v, ok := virtualServer(w, cases.WebNodePort)
			if !ok || v.Scheduler != "rr" || len(v.RealServers) != 3 {
				t.Fatalf("taken over: %v, want rr with the two endpoints and %v draining", v, foreignDest)
			}
			for _, r := range v.RealServers {
				if want := 1; r.Addr == foreignDest {
					if r.Weight != 0 {
						t.Errorf("the foreign real server has weight %d, want 0 (draining)", r.Weight)
					}
				} else if r.Weight != want {
					t.Errorf("real server %v has weight %d, want %d", r.Addr, r.Weight, want)
				}
			}
			w.apply(full, cases.DNS(0)) // no longer asked for
			w.apply(true, cases.DNS(0))
			if !hasVS(w, cases.WebNodePort) {
				t.Errorf("once no Service asks for it, a virtual server that was taken over was deleted")
			}
			if w.m.Repairs() != 0 {
				t.Errorf("Repairs() = %d, want 0", w.m.Repairs())
			}
		})
	}
}

func hasVS(w *world, a netip.AddrPort) bool {
	_, ok := virtualServer(w, a)
	return ok
}

func virtualServer(w *world, a netip.AddrPort) (ipvstest.VirtualServer, bool) {
	for _, v := range w.f.IPVS.Services() {
		if v.Addr == a {
			return v, true
		}
	}
	return ipvstest.VirtualServer{}, false
}

func TestRandomFully(t *testing.T) {
	for _, tc := range []struct {
		version string
		want    bool
	}{
		{"iptables v1.8.9 (nf_tables)", true},
		{"iptables v1.6.2", true},
		{"iptables v1.6.1", false},
		{"iptables v1.4.21", false},
		{"garbage", false},
	} {
		w := newWorld(t, ipvs.Config{})
		w.f.Rules.SetVersion(tc.version)
		w.apply(false, cases.Web(0))
		if got := strings.Contains(w.f.Rules.Dump(), "--random-fully"); got != tc.want {
			t.Errorf("%q: --random-fully %v, want %v", tc.version, got, tc.want)
		}
	}
}

func TestFakeIPVSErrors(t *testing.T) {
	f := ipvstest.NewIPVS(nil)
	s := ipvs.VirtualService(lb.TCP, cases.WebClusterIP, "rr")
	d := ipvs.RealServer(be(0), 1)
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"update missing service", f.UpdateService(s), syscall.ESRCH},
		{"delete missing service", f.DelService(s), syscall.ESRCH},
		{"unknown scheduler", f.NewService(ipvs.VirtualService(lb.TCP, cases.WebClusterIP, "nope")), syscall.ENOENT},
		{"create", f.NewService(s), nil},
		{"create again", f.NewService(s), syscall.EEXIST},
		{"update missing destination", f.UpdateDestination(s, d), syscall.ENOENT},
		{"add destination", f.NewDestination(s, d), nil},
		{"add it again", f.NewDestination(s, d), syscall.EEXIST},
		{"delete destination", f.DelDestination(s, d), nil},
		{"delete it again", f.DelDestination(s, d), syscall.ENOENT},
	} {
		if !errors.Is(tc.err, tc.want) && !(tc.err == nil && tc.want == nil) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	got, _ := f.GetServices()
	if len(got) != 1 || got[0].Flags&ipvs.FlagHashed == 0 {
		t.Errorf("GetServices: %+v, want one with the hashed flag", got)
	}
}

func TestFakeRulesRefusesWhatIptablesRefuses(t *testing.T) {
	ctx := context.Background()
	f := netfiltertest.NewFake()
	for _, bad := range []string{
		"*nat\n-A PREROUTING -j NOPE\nCOMMIT\n",
		"*nat\n-A PREROUTING -m set --match-set nope dst -j RETURN\nCOMMIT\n",
		"*nat\n-D PREROUTING -j RETURN\nCOMMIT\n",
		"*nat\n-X PREROUTING\nCOMMIT\n",
		"*nat\n:A - [0:0]\n-A PREROUTING -j A\n-X A\nCOMMIT\n",
		"*nat\n-A PREROUTING -j RETURN\n",
	} {
		if err := f.IPTablesRestore(ctx, ipvs.IPv4, []byte(bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
	if out, _ := f.IPTablesSave(ctx, ipvs.IPv4, "nat"); strings.Contains(string(out), "-A") {
		t.Errorf("a failed restore left rules:\n%s", out)
	}
	for _, bad := range []string{
		"add nope 1.2.3.4",
		"create s hash:ip\nadd s 2001:db8::1",
		"create p hash:ip,port\nadd p 1.2.3.4,bogus:80",
		"create s hash:ip,port",
		"create q bitmap:port range 0-65535\nswap q s",
	} {
		if err := f.IPSetRestore(ctx, []byte(bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
	if err := f.IPTablesRestore(ctx, ipvs.IPv4, []byte("*filter\n-A INPUT -m set --match-set s src -j DROP\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	if err := f.IPSetDestroy(ctx, "s"); !errors.Is(err, ipvs.ErrSetInUse) {
		t.Errorf("destroying a set in use: %v", err)
	}
	if err := f.IPSetDestroy(ctx, "nope"); !errors.Is(err, ipvs.ErrNoSet) {
		t.Errorf("destroying a missing set: %v", err)
	}
}

func TestAvailable(t *testing.T) {
	err := ipvs.Available()
	if err == nil {
		t.Log("this kernel has IPVS")
		return
	}
	if !errors.Is(err, ipvs.ErrUnavailable) {
		t.Fatalf("Available() = %v, want an error wrapping ErrUnavailable", err)
	}
	t.Logf("Available() = %v", err)
	// With the real kernel and no IPVS, Apply fails with it and touches
	// nothing; Cleanup has no virtual servers to remove.
	m, err := ipvs.New(ipvs.Config{Rules: netfiltertest.NewFake(), Links: ipvstest.NewLinks(), Sysctls: ipvstest.NewSysctls(), Conntrack: &ipvstest.Conntrack{}})
	if err != nil {
		t.Fatal(err)
	}
	st := lb.NewStore(lb.StoreOptions{})
	snap, _ := st.Replace([]lb.Service{cases.Web(0)})
	if err := m.Apply(context.Background(), snap, true); !errors.Is(err, ipvs.ErrUnavailable) {
		t.Errorf("Apply without IPVS: %v, want ErrUnavailable", err)
	}
	if err := m.Cleanup(context.Background()); err != nil {
		t.Errorf("Cleanup without IPVS: %v", err)
	}
}

// TestParameters: a full sync sets vs/conntrack, expire_nodest_conn,
// expire_quiescent_template and ip_forward, and conn_reuse_mode=0 only on
// the kernels whose default delays reused ports (4.1 to 5.8), as
// kube-proxy does; a parameter changed behind its back comes back.
func TestParameters(t *testing.T) {
	for _, tt := range []struct {
		release   string
		connReuse string // conn_reuse_mode after a sync (the default is 1)
	}{
		{"4.18.0-553.el8_10.x86_64", "0"}, // RHEL 8
		{"5.4.0-150-generic", "0"},
		{"5.8.18", "0"},
		{"4.1.0", "0"},
		{"5.9.0", "1"},
		{"5.10.0-28-amd64", "1"},
		{"6.1.0-18-amd64", "1"},
		{"4.0.9", "1"},
		{"3.10.0-1160.el7.x86_64", "1"},
		{"garbage", "1"},
	} {
		t.Run(tt.release, func(t *testing.T) {
			w := newWorld(t, ipvs.Config{KernelRelease: tt.release})
			w.apply(true, cases.Web(0))
			v := w.f.Sysctls.Values()
			want := map[string]string{"net/ipv4/vs/conntrack": "1", "net/ipv4/vs/expire_nodest_conn": "1",
				"net/ipv4/vs/expire_quiescent_template": "1", "net/ipv4/ip_forward": "1", "net/ipv4/vs/conn_reuse_mode": tt.connReuse}
			for name, val := range want {
				if v[name] != val {
					t.Errorf("%s = %q, want %q", name, v[name], val)
				}
			}
			if err := w.f.Sysctls.SetSysctl("net/ipv4/ip_forward", "0"); err != nil {
				t.Fatal(err)
			}
			w.apply(true, cases.Web(0))
			if got := w.f.Sysctls.Values()["net/ipv4/ip_forward"]; got != "1" {
				t.Errorf("ip_forward turned off behind its back: %q after a full sync, want 1", got)
			}
		})
	}
}

// TestShortCircuit: a virtual server serves every client alike, so the
// mode does as kube-proxy's ipvs mode (kubernetes#97081): a Local
// Service's external frontends serve this node's endpoints, or, when it
// has none, every endpoint, so that pods reach them. The first Apply with
// a Service whose pods would get other endpoints from kube-proxy's
// iptables mode warns, once.
func TestShortCircuit(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	w := newWorld(t, ipvs.Config{Logger: zap.New(core)})
	local := func(nodes ...string) lb.Service {
		s := cases.Web(0, 1)
		s.ExternalTrafficPolicy = lb.PolicyLocal
		for i := range s.Endpoints {
			s.Endpoints[i].NodeName = nodes[i]
		}
		return s
	}
	warned := func() int { return logs.FilterMessageSnippet("externalTrafficPolicy Local").Len() }
	backends := func(to netip.AddrPort) map[netip.AddrPort]bool {
		seen := map[netip.AddrPort]bool{}
		for range 40 {
			v := w.f.Trace(w.packet(cases.Pod, lb.TCP, to))
			if v.Action != ipvstest.Forwarded || v.Masquerade {
				t.Fatalf("pod -> %v: %v, want forwarded, not masqueraded", to, v)
			}
			seen[v.Backend] = true
		}
		return seen
	}
	w.apply(true, local(nodeName, nodeName))
	if n := warned(); n != 0 {
		t.Errorf("%d warnings with every endpoint on this node, want none", n)
	}
	w.apply(true, local("node-b", "node-b"))
	for _, to := range []netip.AddrPort{cases.WebExternalIP, cases.WebLBIP, cases.WebNodePort} {
		if got := backends(to); len(got) != 2 {
			t.Errorf("no endpoint here: %v serves %v, want both endpoints elsewhere", to, got)
		}
		// The node, from the VIP itself: masqueraded, or the endpoint's
		// node (which holds the VIP too) would take the answer. (To a
		// NodePort its source is its own address.)
		if v := w.f.Trace(w.packet(cases.Node, lb.TCP, to)); v.Action != ipvstest.Forwarded || v.Masquerade != (to != cases.WebNodePort) {
			t.Errorf("node -> %v: %v, want forwarded, masqueraded unless to the NodePort", to, v)
		}
	}
	if n := warned(); n != 0 {
		t.Errorf("%d warnings with no endpoint here (every client gets every endpoint), want none", n)
	}
	w.apply(false, local(nodeName, "node-b"))
	w.apply(true, local(nodeName, "node-b"))
	if got := backends(cases.WebExternalIP); len(got) != 1 {
		t.Errorf("an endpoint here: the ExternalIP serves %v, want it alone", got)
	}
	if n := warned(); n != 1 {
		t.Errorf("%d warnings, want 1", n)
	}
}
