package redirect

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/svcproxy/svcproxy/conntrack/conntracktest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
	"github.com/svcproxy/svcproxy/redirect/steertable/steertabletest"
)

func TestSteering(t *testing.T) {
	for _, b := range fakeBackends {
		for _, v := range []struct {
			name    string
			nodeIPs []netip.Addr
		}{
			{"redirect", nil},
			{"dnat to the node's addresses", []netip.Addr{nodeIP, nodeIP6}},
			{"dnat in IPv4, redirect in IPv6", []netip.Addr{nodeIP}},
		} {
			t.Run(b.name+"/"+v.name, func(t *testing.T) { testSteering(t, b.new, v.nodeIPs) })
		}
	}
}

// steeredVia is want with Config.NodeIPs nodeIPs: a redirect to a port is
// a DNAT to the node address of p's family and that port, where there is
// one.
func steeredVia(nodeIPs []netip.Addr, p netfiltertest.Packet, want netfiltertest.Verdict) netfiltertest.Verdict {
	if want.Action != netfiltertest.Redirect {
		return want
	}
	for _, a := range nodeIPs {
		if a.Is6() == p.Dst.Addr().Is6() {
			return netfiltertest.Verdict{Action: netfiltertest.DNAT, Dst: netip.AddrPortFrom(a, want.Port)}
		}
	}
	return want
}

func testSteering(t *testing.T, newRedirector func(testing.TB, Config) (*Redirector, tracer), nodeIPs []netip.Addr) {
	r, f := newRedirector(t, Config{IPv6: true, NodeIPs: nodeIPs, ClusterCIDRs: clusterCIDRs})
	snap := store(t, testServices()...).Snapshot()
	mustApply(t, r, snap, testPorts(), true)

	marked := func(p netfiltertest.Packet) netfiltertest.Packet { p.Mark = testMark | 0x1; return p }
	for _, tc := range []struct {
		name string
		p    netfiltertest.Packet
		want netfiltertest.Verdict
	}{
		{"ClusterIP TCP from a pod", pkt(lb.TCP, "10.96.0.10:80", netfiltertest.Prerouting), redirected(testTCPPort)},
		{"ClusterIP TCP from the node", pkt(lb.TCP, "10.96.0.10:80", netfiltertest.Output), redirected(testTCPPort)},
		{"netfilter.IPv6 ClusterIP from a pod", pkt(lb.TCP, "[fd00::10]:80", netfiltertest.Prerouting), redirected(testTCPPort)},
		{"netfilter.IPv6 ClusterIP from the node", pkt(lb.TCP, "[fd00::10]:80", netfiltertest.Output), redirected(testTCPPort)},
		{"ExternalIP", pkt(lb.TCP, "203.0.113.10:80", netfiltertest.Prerouting), redirected(testTCPPort)},
		{"ExternalIP from the node", pkt(lb.TCP, "203.0.113.10:80", netfiltertest.Output), redirected(testTCPPort)},
		{"LoadBalancer IP", pkt(lb.TCP, "203.0.113.20:80", netfiltertest.Prerouting), redirected(testTCPPort)},
		{"NodePort on a node address", pkt(lb.TCP, "192.0.2.10:30080", netfiltertest.Prerouting), redirected(testTCPPort)},
		{"NodePort on the other node address", pkt(lb.TCP, "198.51.100.10:30080", netfiltertest.Prerouting), redirected(testTCPPort)},
		{"NodePort on the node's netfilter.IPv6 address", pkt(lb.TCP, "[2001:db8::10]:30080", netfiltertest.Prerouting), redirected(testTCPPort)},
		{"NodePort on localhost from the node", pkt(lb.TCP, "127.0.0.1:30080", netfiltertest.Output), redirected(testTCPPort)},
		{"NodePort on an address not the node's", pkt(lb.TCP, "192.0.2.99:30080", netfiltertest.Prerouting), accepted},
		{"NodePort of the wrong protocol", pkt(lb.UDP, "192.0.2.10:30080", netfiltertest.Prerouting), accepted},

		{"Local policy without local endpoints: ClusterIP still served", pkt(lb.TCP, "10.96.0.11:80", netfiltertest.Prerouting), redirected(testTCPPort)},
		// Clients inside the cluster are steered to the forwarder, which
		// serves them the short circuit (lb.Pool.ShortCircuit); the others
		// are refused (TestShortCircuitSteering has more).
		{"Local policy without local endpoints: LB IP steered for a pod", pkt(lb.TCP, "203.0.113.21:80", netfiltertest.Prerouting), redirected(testTCPPort)},
		{"Local policy without local endpoints: NodePort steered for a pod", pkt(lb.TCP, "192.0.2.10:30081", netfiltertest.Prerouting), redirected(testTCPPort)},
		{"Local policy without local endpoints: NodePort from the node steered", pkt(lb.TCP, "127.0.0.1:30081", netfiltertest.Output), redirected(testTCPPort)},
		{"Local policy without local endpoints: LB IP refused outside the cluster", from(outsideIP, pkt(lb.TCP, "203.0.113.21:80", netfiltertest.Prerouting)), rejected},
		{"Local policy without local endpoints: NodePort refused outside the cluster", from(outsideIP, pkt(lb.TCP, "192.0.2.10:30081", netfiltertest.Prerouting)), rejected},

		{"UDP ClusterIP to its own socket", pkt(lb.UDP, "10.96.0.53:53", netfiltertest.Prerouting), redirected(40053)},
		{"UDP ClusterIP from the node", pkt(lb.UDP, "10.96.0.53:53", netfiltertest.Output), redirected(40053)},
		{"UDP NodePort", pkt(lb.UDP, "192.0.2.10:30053", netfiltertest.Prerouting), redirected(40054)},
		{"UDP NodePort over netfilter.IPv6", pkt(lb.UDP, "[2001:db8::10]:30053", netfiltertest.Prerouting), redirected(40055)},
		{"TCP to a UDP frontend", pkt(lb.TCP, "10.96.0.53:53", netfiltertest.Prerouting), accepted},
		{"UDP straight to a frontend's socket at a node address", pkt(lb.UDP, "192.0.2.10:40053", netfiltertest.Prerouting), dropped},
		{"UDP straight to a NodePort's socket at a node address", pkt(lb.UDP, "198.51.100.10:40054", netfiltertest.Prerouting), dropped},
		{"UDP straight to a frontend's socket from the node", pkt(lb.UDP, "127.0.0.1:40053", netfiltertest.Output), dropped},
		{"UDP straight to an IPv6 NodePort's socket", pkt(lb.UDP, "[2001:db8::10]:40055", netfiltertest.Prerouting), dropped},
		{"UDP to a socket's port number elsewhere", pkt(lb.UDP, "203.0.113.99:40053", netfiltertest.Output), accepted},
		{"TCP to a UDP socket's port", pkt(lb.TCP, "192.0.2.10:40053", netfiltertest.Prerouting), accepted},

		{"no endpoints TCP from a pod", pkt(lb.TCP, "10.96.0.12:80", netfiltertest.Prerouting), rejected},
		{"no endpoints TCP from the node", pkt(lb.TCP, "10.96.0.12:80", netfiltertest.Output), rejected},
		{"no endpoints UDP", pkt(lb.UDP, "10.96.0.13:53", netfiltertest.Prerouting), rejected},
		{"no endpoints UDP from the node", pkt(lb.UDP, "10.96.0.13:53", netfiltertest.Output), rejected},
		{"no endpoints NodePort", pkt(lb.TCP, "192.0.2.10:30082", netfiltertest.Prerouting), rejected},

		{"forwarder's own dial to a ClusterIP", marked(pkt(lb.TCP, "10.96.0.10:80", netfiltertest.Output)), accepted},
		{"forwarder's own dial to a dead ClusterIP", marked(pkt(lb.TCP, "10.96.0.12:80", netfiltertest.Output)), accepted},
		{"forwarder's own dial to a NodePort", marked(pkt(lb.TCP, "127.0.0.1:30080", netfiltertest.Output)), accepted},
		{"forwarder's own dial to a dead NodePort", marked(pkt(lb.TCP, "192.0.2.10:30082", netfiltertest.Output)), accepted},

		{"unrelated port on a ClusterIP", pkt(lb.TCP, "10.96.0.10:81", netfiltertest.Prerouting), accepted},
		{"unrelated address", pkt(lb.TCP, "8.8.8.8:443", netfiltertest.Output), accepted},
		{"unrelated netfilter.IPv6", pkt(lb.UDP, "[2001:4860::8888]:53", netfiltertest.Output), accepted},
		{"unrelated local port", pkt(lb.TCP, "192.0.2.10:22", netfiltertest.Prerouting), accepted},
	} {
		t.Run(tc.name, func(t *testing.T) { checkTrace(t, f, tc.p, steeredVia(nodeIPs, tc.p, tc.want)) })
	}
	target := "REDIRECT"
	if len(nodeIPs) > 0 {
		target = "DNAT"
	}
	if got := f.Trace(pkt(lb.TCP, "10.96.0.10:80", netfiltertest.Prerouting)).Rule; !strings.Contains(strings.ToUpper(got), target) {
		t.Errorf("Verdict.Rule = %q, want the %s rule", got, target)
	}
}

func TestNodePortAddresses(t *testing.T) {
	for _, tc := range []struct {
		name     string
		prefixes []netip.Prefix
		dst      string
		hook     netfiltertest.Hook
		want     netfiltertest.Verdict
	}{
		{"inside", []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, "192.0.2.10:30080", netfiltertest.Prerouting, redirected(testTCPPort)},
		{"local but outside", []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, "198.51.100.10:30080", netfiltertest.Prerouting, accepted},
		{"localhost outside", []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, "127.0.0.1:30080", netfiltertest.Output, accepted},
		{"localhost inside", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, "127.0.0.1:30080", netfiltertest.Output, redirected(testTCPPort)},
		{"inside but not local", []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, "192.0.2.99:30080", netfiltertest.Prerouting, accepted},
		{"host prefix", []netip.Prefix{netip.MustParsePrefix("198.51.100.10/32")}, "198.51.100.10:30080", netfiltertest.Prerouting, redirected(testTCPPort)},
		{"dead NodePort inside", []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, "192.0.2.10:30082", netfiltertest.Prerouting, rejected},
		{"dead NodePort outside", []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, "198.51.100.10:30082", netfiltertest.Prerouting, accepted},
		{"no netfilter.IPv6 prefix: no netfilter.IPv6 NodePorts", []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, "[2001:db8::10]:30080", netfiltertest.Prerouting, accepted},
		{"netfilter.IPv6 prefix", []netip.Prefix{netip.MustParsePrefix("2001:db8::/64")}, "[2001:db8::10]:30080", netfiltertest.Prerouting, redirected(testTCPPort)},
		{"netfilter.IPv4 /0 lifts the netfilter.IPv4 restriction", []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("2001:db8::/64")}, "198.51.100.10:30080", netfiltertest.Prerouting, redirected(testTCPPort)},
		{"ClusterIPs are not restricted", []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, "10.96.0.10:80", netfiltertest.Prerouting, redirected(testTCPPort)},
	} {
		for _, b := range fakeBackends {
			t.Run(b.name+"/"+tc.name, func(t *testing.T) {
				r, f := b.new(t, Config{IPv6: true, NodePortAddresses: tc.prefixes})
				mustApply(t, r, store(t, testServices()...).Snapshot(), testPorts(), true)
				checkTrace(t, f, pkt(lb.TCP, tc.dst, tc.hook), tc.want)
			})
		}
	}
}

func TestIPv6Off(t *testing.T) {
	r, f := newFakeRedirector(t, Config{})
	mustApply(t, r, store(t, testServices()...).Snapshot(), testPorts(), true)
	checkTrace(t, f, pkt(lb.TCP, "10.96.0.10:80", netfiltertest.Prerouting), redirected(testTCPPort))
	checkTrace(t, f, pkt(lb.TCP, "[fd00::10]:80", netfiltertest.Prerouting), accepted)
	checkTrace(t, f, pkt(lb.TCP, "[2001:db8::10]:30080", netfiltertest.Prerouting), accepted)
	// The first Apply looks for IPv6 rules an earlier run left (there are
	// none) and writes nothing there.
	for _, c := range f.Calls() {
		if c.Family == netfilter.IPv6 && strings.HasPrefix(c.Op, "iptables-") && c.Op != "iptables-version" && c.Op != "iptables-save" {
			t.Errorf("netfilter.IPv6 off, but called %s for netfilter.IPv6", c.Op)
		}
	}
	f.ResetCalls()
	mustApply(t, r, store(t, testServices()...).Snapshot(), testPorts(), true)
	for _, c := range f.Calls() {
		if c.Family == netfilter.IPv6 && c.Op != "iptables-version" {
			t.Errorf("netfilter.IPv6 off, but a second Apply called %s for it", c.Op)
		}
	}
}

// TestIPv6SwitchedOff: a process that does not serve IPv6 removes the IPv6
// steering an earlier one wrote, in either backend; left, it would go on
// steering IPv6 Services to ports nobody serves.
func TestIPv6SwitchedOff(t *testing.T) {
	for _, backend := range []Backend{BackendIPTables, BackendNFTables} {
		t.Run(string(backend), func(t *testing.T) {
			f, k := netfiltertest.NewFake(), steertabletest.NewFake()
			var tr tracer = f
			if backend == BackendNFTables {
				tr = k
			}
			snap := store(t, testServices()...).Snapshot()
			before := newRedirector(t, Config{Backend: backend, Exec: f, NFT: k, IPv6: true})
			mustApply(t, before, snap, testPorts(), true)
			checkTrace(t, tr, pkt(lb.TCP, "[fd00::10]:80", netfiltertest.Prerouting), redirected(testTCPPort))

			after := newRedirector(t, Config{Backend: backend, Exec: f, NFT: k})
			mustApply(t, after, snap, testPorts(), true)
			checkTrace(t, tr, pkt(lb.TCP, "10.96.0.10:80", netfiltertest.Prerouting), redirected(testTCPPort))
			for _, p := range []netfiltertest.Packet{
				pkt(lb.TCP, "[fd00::10]:80", netfiltertest.Prerouting),
				pkt(lb.TCP, "[fd00::10]:80", netfiltertest.Output),
				pkt(lb.TCP, "[2001:db8::10]:30080", netfiltertest.Prerouting),
				pkt(lb.UDP, "[2001:db8::10]:40055", netfiltertest.Prerouting),
			} {
				checkTrace(t, tr, p, accepted)
			}
			if k.Has(netfilter.IPv6) {
				t.Error("the IPv6 steering table is still there")
			}
			names, _ := f.IPSetNames(context.Background())
			for _, n := range names {
				if strings.HasSuffix(n, "-v6") {
					t.Errorf("IPv6 set %s is still there", n)
				}
			}
			save, _ := f.IPTablesSave(context.Background(), netfilter.IPv6, "nat")
			if strings.Contains(string(save), chainPrefix) {
				t.Errorf("IPv6 chains still there:\n%s", save)
			}
		})
	}
}

// TestIncremental checks that endpoint changes only change set members, and
// that the rules are rewritten only when the rules themselves change.
func TestIncremental(t *testing.T) {
	ctx := context.Background()
	r, f := newFakeRedirector(t, Config{IPv6: true})
	st := store(t, testServices()...)
	ports := testPorts()
	mustApply(t, r, st.Snapshot(), ports, true)
	if n := f.CountCalls("iptables-restore"); n != 2 {
		t.Errorf("full sync: %d iptables-restore calls, want one per family", n)
	}
	if n := f.CountCalls("ipset-restore"); n != 1 {
		t.Errorf("full sync: %d ipset restore calls, want 1", n)
	}

	type calls struct{ iptables, ipset int }
	step := func(name string, want calls, upserts []lb.Service, deletes ...string) {
		t.Helper()
		var names []lb.ServicePortName
		for _, d := range deletes {
			names = append(names, svcName(d))
		}
		snap, err := st.Update(upserts, names)
		if err != nil {
			t.Fatalf("%s: Update: %v", name, err)
		}
		f.ResetCalls()
		if err := r.Apply(ctx, snap, ports, false); err != nil {
			t.Fatalf("%s: Apply: %v", name, err)
		}
		got := calls{f.CountCalls("iptables-restore"), f.CountCalls("ipset-restore")}
		if got != want {
			t.Errorf("%s: %+v restore calls, want %+v; calls: %v", name, got, want, f.Calls())
		}
		if n := len(f.Calls()); n != got.iptables+got.ipset {
			t.Errorf("%s: %d calls, want only restores: %v", name, n, f.Calls())
		}
	}
	svcs := testServices()

	step("nothing changed", calls{0, 0}, nil)

	empty := svcs[3]
	empty.Endpoints = eps(1, "node-b")
	step("endpoints appear", calls{0, 1}, []lb.Service{empty})
	checkTrace(t, f, pkt(lb.TCP, "10.96.0.12:80", netfiltertest.Prerouting), redirected(testTCPPort))
	checkTrace(t, f, pkt(lb.TCP, "192.0.2.10:30082", netfiltertest.Prerouting), redirected(testTCPPort))

	dns := svcs[2]
	dns.Endpoints = nil
	step("UDP endpoints go", calls{0, 1}, []lb.Service{dns})
	checkTrace(t, f, pkt(lb.UDP, "10.96.0.53:53", netfiltertest.Prerouting), rejected)
	checkTrace(t, f, pkt(lb.UDP, "192.0.2.10:30053", netfiltertest.Prerouting), rejected)

	step("UDP endpoints come back", calls{0, 1}, []lb.Service{svcs[2]})
	checkTrace(t, f, pkt(lb.UDP, "10.96.0.53:53", netfiltertest.Prerouting), redirected(40053))

	added := lb.Service{Name: svcName("added"), Port: 443, ClusterIPs: []netip.Addr{ip("10.96.1.1")}, Endpoints: eps(3, "")}
	step("TCP Service added", calls{0, 1}, []lb.Service{added})
	checkTrace(t, f, pkt(lb.TCP, "10.96.1.1:443", netfiltertest.Prerouting), redirected(testTCPPort))

	step("TCP Service removed", calls{0, 1}, nil, "added")
	checkTrace(t, f, pkt(lb.TCP, "10.96.1.1:443", netfiltertest.Prerouting), accepted)

	step("Service with a NodePort removed", calls{0, 1}, nil, "web")
	for _, dst := range []string{"10.96.0.10:80", "203.0.113.10:80", "203.0.113.20:80", "192.0.2.10:30080", "[fd00::10]:80"} {
		checkTrace(t, f, pkt(lb.TCP, dst, netfiltertest.Prerouting), accepted)
	}

	udp := lb.Service{Name: svcName("dns2"), Protocol: lb.UDP, Port: 53, ClusterIPs: []netip.Addr{ip("10.96.0.99")}, Endpoints: eps(1, "")}
	step("UDP Service added: one restore for the family whose rules changed", calls{1, 1}, []lb.Service{udp})
	checkTrace(t, f, pkt(lb.UDP, "10.96.0.99:53", netfiltertest.Prerouting), redirected(40057))

	ports.TCP = 15002
	step("TCP port changed", calls{2, 0}, nil)
	checkTrace(t, f, pkt(lb.TCP, "10.96.0.11:80", netfiltertest.Output), redirected(15002))
	if r.Repairs() != 0 {
		t.Errorf("Repairs = %d without tampering", r.Repairs())
	}

	// A full sync now finds exactly what the incremental ones wrote.
	mustApply(t, r, st.Snapshot(), ports, true)
	if r.Repairs() != 0 {
		t.Errorf("Repairs = %d after a clean full sync", r.Repairs())
	}
}

// TestRepair tampers with the fake between full syncs.
func TestRepair(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		tamper func(f *netfiltertest.Fake) error
		broken netfiltertest.Packet // a packet the tampering misroutes
	}{
		{"chain flushed", func(f *netfiltertest.Fake) error {
			return f.IPTablesRestore(ctx, netfilter.IPv4, []byte("*nat\n-F SVCPROXY-SERVICES\nCOMMIT\n"))
		}, pkt(lb.TCP, "10.96.0.10:80", netfiltertest.Prerouting)},
		{"rule deleted", func(f *netfiltertest.Fake) error {
			return f.IPTablesRestore(ctx, netfilter.IPv4, []byte("*filter\n-D SVCPROXY-REJECT -p tcp -m set --match-set svcproxy-reject-v4 dst,dst -j REJECT --reject-with tcp-reset\nCOMMIT\n"))
		}, pkt(lb.TCP, "10.96.0.12:80", netfiltertest.Prerouting)},
		{"jump deleted", func(f *netfiltertest.Fake) error {
			return f.IPTablesRestore(ctx, netfilter.IPv6, []byte("*nat\n-D OUTPUT -j SVCPROXY-SERVICES\nCOMMIT\n"))
		}, pkt(lb.TCP, "[fd00::10]:80", netfiltertest.Output)},
		{"rule inserted before ours", func(f *netfiltertest.Fake) error {
			return f.IPTablesRestore(ctx, netfilter.IPv4, []byte("*nat\n-I SVCPROXY-SERVICES 1 -j RETURN\nCOMMIT\n"))
		}, pkt(lb.TCP, "10.96.0.10:80", netfiltertest.Output)},
		{"set member deleted", func(f *netfiltertest.Fake) error {
			return f.IPSetRestore(ctx, []byte("del svcproxy-svc-v4 10.96.0.10,tcp:80\n"))
		}, pkt(lb.TCP, "10.96.0.10:80", netfiltertest.Prerouting)},
		{"set member added", func(f *netfiltertest.Fake) error {
			return f.IPSetRestore(ctx, []byte("add svcproxy-reject-v4 8.8.8.8,tcp:443\n"))
		}, pkt(lb.TCP, "8.8.8.8:443", netfiltertest.Output)},
		{"NodePort flushed", func(f *netfiltertest.Fake) error {
			return f.IPSetRestore(ctx, []byte("flush svcproxy-np-tcp\n"))
		}, pkt(lb.TCP, "192.0.2.10:30080", netfiltertest.Prerouting)},
		{"stray chain and set", func(f *netfiltertest.Fake) error {
			return errors.Join(
				f.IPSetRestore(ctx, []byte("create svcproxy-old hash:ip,port family inet\nadd svcproxy-old 8.8.8.8,tcp:443\n")),
				f.IPTablesRestore(ctx, netfilter.IPv4, []byte("*nat\n:SVCPROXY-OLD - [0:0]\n-A SVCPROXY-OLD -p tcp -m set --match-set svcproxy-old dst,dst -j REDIRECT --to-ports 1\n-I PREROUTING 1 -j SVCPROXY-OLD\nCOMMIT\n")))
		}, pkt(lb.TCP, "8.8.8.8:443", netfiltertest.Prerouting)},
		{"duplicate jump", func(f *netfiltertest.Fake) error {
			return f.IPTablesRestore(ctx, netfilter.IPv4, []byte("*filter\n-A INPUT -j SVCPROXY-REJECT\n-A INPUT -s 10.0.0.0/8 -j SVCPROXY-REJECT\nCOMMIT\n"))
		}, netfiltertest.Packet{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, f := newFakeRedirector(t, Config{IPv6: true})
			snap := store(t, testServices()...).Snapshot()
			mustApply(t, r, snap, testPorts(), true)
			clean := f.Dump()
			check := tc.broken.Dst.IsValid()
			var want netfiltertest.Verdict
			if check {
				want = f.Trace(tc.broken)
			}
			if err := tc.tamper(f); err != nil {
				t.Fatalf("tampering: %v", err)
			}
			if check {
				if got := f.Trace(tc.broken); got.Action == want.Action && got.Port == want.Port {
					t.Fatalf("tampering did not change the verdict (%v): the test tests nothing", got)
				}
			}
			mustApply(t, r, snap, testPorts(), false)
			if r.Repairs() != 0 {
				t.Errorf("an incremental sync counted a repair")
			}
			mustApply(t, r, snap, testPorts(), true)
			if r.Repairs() != 1 {
				t.Errorf("Repairs = %d, want 1", r.Repairs())
			}
			if got := f.Dump(); got != clean {
				t.Errorf("after repair:\n%s\nwant:\n%s", got, clean)
			}
			if check {
				checkTrace(t, f, tc.broken, want)
			}
			mustApply(t, r, snap, testPorts(), true)
			if r.Repairs() != 1 {
				t.Errorf("Repairs = %d after a clean full sync, want still 1", r.Repairs())
			}
		})
	}
}

// foreign is what another program keeps in the tables and sets.
const foreignNat = `*nat
:FOREIGN - [0:0]
-A PREROUTING -s 203.0.113.0/24 -j FOREIGN
-A FOREIGN -p tcp -m tcp --dport 8080 -j REDIRECT --to-ports 9090
-A POSTROUTING -o eth0 -j MASQUERADE
COMMIT
*filter
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
-A FORWARD -m set --match-set foreign-set src -j DROP
COMMIT
`

func TestCleanup(t *testing.T) {
	ctx := context.Background()
	r, f := newFakeRedirector(t, Config{IPv6: true})
	if err := f.IPSetRestore(ctx, []byte("create foreign-set hash:net family inet\nadd foreign-set 10.0.0.0/8\n")); err != nil {
		t.Fatal(err)
	}
	if err := f.IPTablesRestore(ctx, netfilter.IPv4, []byte(foreignNat)); err != nil {
		t.Fatal(err)
	}
	before := f.Dump()
	mustApply(t, r, store(t, testServices()...).Snapshot(), testPorts(), true)
	if got := f.Trace(pkt(lb.TCP, "203.0.113.10:80", netfiltertest.Prerouting)); got.Action != netfiltertest.Redirect {
		t.Fatalf("ExternalIP not redirected: %v", got)
	}
	// A rule from another process in the foreign chain jumping into ours.
	if err := f.IPTablesRestore(ctx, netfilter.IPv4, []byte("*nat\n-A FOREIGN -j SVCPROXY-SERVICES\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	if err := r.Cleanup(ctx); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if got := f.Dump(); got != before {
		t.Errorf("after Cleanup:\n%s\nbefore the first Apply:\n%s", got, before)
	}

	// Cleanup by a process that installed nothing (svcproxy --cleanup).
	mustApply(t, r, store(t, testServices()...).Snapshot(), testPorts(), true)
	other, err := New(Config{Backend: BackendIPTables, NFT: steertabletest.NewFake(), Conntrack: &conntracktest.Table{}, Mark: 1, Exec: f})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Cleanup(ctx); err != nil {
		t.Fatalf("Cleanup by another Redirector: %v", err)
	}
	if got := f.Dump(); got != before {
		t.Errorf("after Cleanup by another process (netfilter.IPv6 off there):\n%s\nwant:\n%s", got, before)
	}
	if err := other.Cleanup(ctx); err != nil {
		t.Errorf("second Cleanup: %v", err)
	}
	// r did not see that: to it, another process removing its rules is
	// tampering, which its next full sync repairs.
	mustApply(t, r, store(t, testServices()...).Snapshot(), testPorts(), true)
	checkTrace(t, f, pkt(lb.TCP, "10.96.0.10:80", netfiltertest.Output), redirected(testTCPPort))
	if r.Repairs() != 1 {
		t.Errorf("Repairs = %d, want 1", r.Repairs())
	}
}

func TestFaults(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")
	st := store(t, testServices()...)
	svcs := testServices()

	t.Run("incremental failure falls back to a full sync", func(t *testing.T) {
		r, f := newFakeRedirector(t, Config{})
		mustApply(t, r, st.Snapshot(), testPorts(), true)
		empty := svcs[3]
		empty.Endpoints = eps(1, "")
		snap, _ := store(t, append(svcs[:3:3], empty, svcs[4])...).Replace(append(svcs[:3:3], empty, svcs[4]))
		f.FailNext("ipset-restore", boom)
		mustApply(t, r, snap, testPorts(), false)
		checkTrace(t, f, pkt(lb.TCP, "10.96.0.12:80", netfiltertest.Prerouting), redirected(testTCPPort))
	})
	t.Run("failed full sync leaves the next Apply full", func(t *testing.T) {
		r, f := newFakeRedirector(t, Config{})
		f.FailNext("iptables-restore", boom)
		err := r.Apply(ctx, st.Snapshot(), testPorts(), true)
		if !errors.Is(err, boom) {
			t.Fatalf("Apply = %v, want boom", err)
		}
		f.ResetCalls()
		mustApply(t, r, st.Snapshot(), testPorts(), false)
		if n := f.CountCalls("iptables-save"); n == 0 {
			t.Errorf("Apply after a failure was not a full sync")
		}
		checkTrace(t, f, pkt(lb.TCP, "10.96.0.10:80", netfiltertest.Prerouting), redirected(testTCPPort))
		if r.Repairs() != 0 {
			t.Errorf("Repairs = %d; a failed sync is not tampering", r.Repairs())
		}
		if n := r.RestoreFailures(netfilter.IPv4); n != 1 {
			t.Errorf("RestoreFailures(IPv4) = %d, want 1", n)
		}
	})
	t.Run("reading fails", func(t *testing.T) {
		r, f := newFakeRedirector(t, Config{IPv6: true})
		f.FailNext("iptables-save", boom)
		if err := r.Apply(ctx, st.Snapshot(), testPorts(), true); !errors.Is(err, boom) {
			t.Fatalf("Apply = %v, want boom", err)
		}
	})
}

func TestBadInput(t *testing.T) {
	ctx := context.Background()
	r, f := newFakeRedirector(t, Config{})
	if err := r.Apply(ctx, nil, testPorts(), true); err == nil {
		t.Error("Apply(nil snapshot) succeeded")
	}
	snap := store(t, testServices()...).Snapshot()
	if err := r.Apply(ctx, snap, Ports{}, true); err == nil {
		t.Error("Apply without a TCP port succeeded")
	}
	if len(f.Calls()) != 1 { // New's version check
		t.Errorf("bad input reached the kernel: %v", f.Calls())
	}

	// A UDP frontend without a forwarder port is reported; the rest works.
	ports := testPorts()
	delete(ports.UDP, lb.Frontend{Protocol: lb.UDP, Addr: ap("10.96.0.53:53")})
	err := r.Apply(ctx, snap, ports, true)
	if err == nil || !strings.Contains(err.Error(), "default/dns:p") || !strings.Contains(err.Error(), "10.96.0.53:53") {
		t.Errorf("Apply = %v, want an error naming the Service and frontend", err)
	}
	checkTrace(t, f, pkt(lb.UDP, "10.96.0.53:53", netfiltertest.Prerouting), accepted)
	checkTrace(t, f, pkt(lb.UDP, "192.0.2.10:30053", netfiltertest.Prerouting), redirected(40054))
	checkTrace(t, f, pkt(lb.TCP, "10.96.0.10:80", netfiltertest.Prerouting), redirected(testTCPPort))
	checkTrace(t, f, pkt(lb.UDP, "10.96.0.13:53", netfiltertest.Prerouting), rejected)

	for _, cfg := range []Config{
		{},
		{Mark: 1, NodePortAddresses: []netip.Prefix{{}}},
		{Mark: 1, NodeIPs: []netip.Addr{{}}},
		{Mark: 1, NodeIPs: []netip.Addr{ip("0.0.0.0")}},
		{Mark: 1, NodeIPs: []netip.Addr{ip("127.0.0.1")}},
		{Mark: 1, NodeIPs: []netip.Addr{ip("::1")}},
		{Mark: 1, NodeIPs: []netip.Addr{ip("fe80::1")}},
		{Mark: 1, NodeIPs: []netip.Addr{ip("224.0.0.1")}},
		{Mark: 1, NodeIPs: []netip.Addr{nodeIP, nodeIP2}},
	} {
		cfg.Exec, cfg.NFT = netfiltertest.NewFake(), steertabletest.NewFake()
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
}

func TestBackend(t *testing.T) {
	for v, want := range map[string]string{
		"iptables v1.8.9 (nf_tables)": "nf_tables",
		"iptables v1.8.9 (legacy)":    "legacy",
		"iptables v1.6.1":             "legacy",
	} {
		f := netfiltertest.NewFake()
		f.SetVersion(v)
		r, err := New(Config{Backend: BackendIPTables, NFT: steertabletest.NewFake(), Conntrack: &conntracktest.Table{}, Mark: 1, Exec: f})
		if err != nil {
			t.Fatal(err)
		}
		if got := r.IPTables(); got != want {
			t.Errorf("IPTables() with %q = %q, want %q", v, got, want)
		}
	}
}

// TestFrontendConflict: a frontend two Services claim goes to the one the
// snapshot routes it to, never into both sets.
func TestFrontendConflict(t *testing.T) {
	r, f := newFakeRedirector(t, Config{})
	a := lb.Service{Name: svcName("a"), Port: 80, ClusterIPs: []netip.Addr{ip("10.96.0.1")}, NodePort: 30000}
	b := lb.Service{Name: svcName("b"), Port: 80, ClusterIPs: []netip.Addr{ip("10.96.0.1")}, NodePort: 30000, Endpoints: eps(1, "")}
	st := lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: nodeName}})
	snap, err := st.Replace([]lb.Service{a, b})
	if err == nil {
		t.Fatal("the store accepted a conflict")
	}
	mustApply(t, r, snap, testPorts(), true)
	checkTrace(t, f, pkt(lb.TCP, "10.96.0.1:80", netfiltertest.Prerouting), rejected) // a sorts first, and has no endpoints
	checkTrace(t, f, pkt(lb.TCP, "192.0.2.10:30000", netfiltertest.Prerouting), rejected)
}

// TestSCTPUnsteered: an SCTP Service, with endpoints or without, is not
// steered, nor rejected, nor an error: the forwarder cannot serve it, and
// its packets go on untouched. Nothing else changes around it.
func TestSCTPUnsteered(t *testing.T) {
	r, f := newFakeRedirector(t, Config{IPv6: true})
	services := append(testServices(),
		lb.Service{Name: lb.ServicePortName{Namespace: "default", Name: "diameter"}, Protocol: lb.SCTP, Port: 3868,
			ClusterIPs: []netip.Addr{ip("10.96.0.38")}, ExternalIPs: []netip.Addr{ip("203.0.113.38")}, NodePort: 30868,
			Endpoints: []lb.Endpoint{{Addr: ap("10.244.7.1:3868"), Ready: true, Serving: true}}},
		lb.Service{Name: lb.ServicePortName{Namespace: "default", Name: "dead-sctp"}, Protocol: lb.SCTP, Port: 3868,
			ClusterIPs: []netip.Addr{ip("10.96.0.39")}, NodePort: 30869},
		// The same VIP and port as a TCP Service: only TCP is steered.
		lb.Service{Name: lb.ServicePortName{Namespace: "default", Name: "web-sctp"}, Protocol: lb.SCTP, Port: 80,
			ClusterIPs: []netip.Addr{ip("10.96.0.10")}, NodePort: 30080},
	)
	mustApply(t, r, store(t, services...).Snapshot(), testPorts(), true)
	for _, tc := range []struct {
		name string
		p    netfiltertest.Packet
		want netfiltertest.Verdict
	}{
		{"SCTP ClusterIP", pkt(lb.SCTP, "10.96.0.38:3868", netfiltertest.Prerouting), accepted},
		{"SCTP ClusterIP from the node", pkt(lb.SCTP, "10.96.0.38:3868", netfiltertest.Output), accepted},
		{"SCTP ExternalIP", pkt(lb.SCTP, "203.0.113.38:3868", netfiltertest.Prerouting), accepted},
		{"SCTP NodePort", pkt(lb.SCTP, "192.0.2.10:30868", netfiltertest.Prerouting), accepted},
		{"SCTP without endpoints: not rejected", pkt(lb.SCTP, "10.96.0.39:3868", netfiltertest.Prerouting), accepted},
		{"SCTP NodePort without endpoints: not rejected", pkt(lb.SCTP, "192.0.2.10:30869", netfiltertest.Prerouting), accepted},
		{"SCTP on a TCP Service's VIP and port", pkt(lb.SCTP, "10.96.0.10:80", netfiltertest.Prerouting), accepted},
		{"SCTP on a TCP Service's NodePort", pkt(lb.SCTP, "192.0.2.10:30080", netfiltertest.Prerouting), accepted},
		{"TCP beside it still steered", pkt(lb.TCP, "10.96.0.10:80", netfiltertest.Prerouting), redirected(testTCPPort)},
		{"TCP NodePort beside it still steered", pkt(lb.TCP, "192.0.2.10:30080", netfiltertest.Prerouting), redirected(testTCPPort)},
	} {
		t.Run(tc.name, func(t *testing.T) { checkTrace(t, f, tc.p, tc.want) })
	}
	if dump := f.Dump(); strings.Contains(dump, "sctp") {
		t.Errorf("SCTP in the rules or sets:\n%s", dump)
	}
}
