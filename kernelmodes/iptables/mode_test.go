package iptables

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/conntrack/conntracktest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
)

const (
	pre = netfiltertest.Prerouting
	out = netfiltertest.Output
)

var (
	web4     = []string{"10.244.1.1:8080", "10.244.1.2:8080"}
	web6     = []string{"[fd00:244::1:1]:8080", "[fd00:244::1:2]:8080"}
	local    = []string{"10.244.2.1:8080"}
	dns      = []string{"10.244.3.1:8080", "10.244.3.2:8080"}
	lokAll   = []string{"10.244.4.1:8080", "10.244.5.1:8080", "10.244.5.2:8080"}
	lokHere  = []string{"10.244.4.1:8080"}
	sticky   = []string{"10.244.6.1:8080", "10.244.6.2:8080", "10.244.6.3:8080"}
	diameter = []string{"10.244.7.1:8080", "10.244.7.2:8080"}
)

// serviceCases is the Service-semantics table: the redirect tests' cases,
// as DNAT. The privileged tests run the same semantics for real.
var serviceCases = []struct {
	name string
	p    netfiltertest.Packet
	want want
}{
	{"ClusterIP TCP from a pod", pkt(lb.TCP, "10.96.0.10:80", pre), spread(false, web4...)},
	{"ClusterIP TCP from the node", pkt(lb.TCP, "10.96.0.10:80", out), spread(false, web4...)},
	{"IPv6 ClusterIP from a pod: IPv6 endpoints only", pkt(lb.TCP, "[fd00::10]:80", pre), spread(false, web6...)},
	{"IPv6 ClusterIP from the node", pkt(lb.TCP, "[fd00::10]:80", out), spread(false, web6...)},
	{"ExternalIP: masqueraded (Cluster policy)", pkt(lb.TCP, "203.0.113.10:80", pre), spread(true, web4...)},
	{"ExternalIP from the node", pkt(lb.TCP, "203.0.113.10:80", out), spread(true, web4...)},
	{"LoadBalancer IP", pkt(lb.TCP, "203.0.113.20:80", pre), spread(true, web4...)},
	{"NodePort on a node address", pkt(lb.TCP, "192.0.2.10:30080", pre), spread(true, web4...)},
	{"NodePort on the other node address", pkt(lb.TCP, "198.51.100.10:30080", pre), spread(true, web4...)},
	{"NodePort on the node's IPv6 address", pkt(lb.TCP, "[2001:db8::10]:30080", pre), spread(true, web6...)},
	{"NodePort from the node to its own address", pkt(lb.TCP, "192.0.2.10:30080", out), spread(true, web4...)},
	{"NodePort on localhost: not served in DNAT mode", pkt(lb.TCP, "127.0.0.1:30080", out), accepted},
	{"NodePort on an address not the node's", pkt(lb.TCP, "192.0.2.99:30080", pre), accepted},
	{"NodePort of the wrong protocol", pkt(lb.UDP, "192.0.2.10:30080", pre), accepted},

	{"Local policy without local endpoints: ClusterIP still served", pkt(lb.TCP, "10.96.0.11:80", pre), spread(false, local...)},
	// Without ClusterCIDRs a pod is not told from a client outside the
	// cluster (TestShortCircuit has them).
	{"Local policy without local endpoints: LB IP rejected", pkt(lb.TCP, "203.0.113.21:80", pre), rejected},
	{"Local policy without local endpoints: NodePort rejected", pkt(lb.TCP, "192.0.2.10:30081", pre), rejected},
	{"Local policy without local endpoints: NodePort from the node short-circuited to every endpoint, masqueraded", pkt(lb.TCP, "192.0.2.10:30081", out), spread(true, local...)},
	{"Local policy without local endpoints: LB IP from the node short-circuited", pkt(lb.TCP, "203.0.113.21:80", out), spread(true, local...)},
	{"Local policy with a local endpoint: ExternalIP to it only, client address kept", pkt(lb.TCP, "203.0.113.14:443", pre), spread(false, lokHere...)},
	{"Local policy with a local endpoint: NodePort to it only", pkt(lb.TCP, "198.51.100.10:30443", pre), spread(false, lokHere...)},
	{"Local policy with a local endpoint: ExternalIP from the node to all, masqueraded", pkt(lb.TCP, "203.0.113.14:443", out), spread(true, lokAll...)},
	{"Local policy with a local endpoint: NodePort from the node to all", pkt(lb.TCP, "192.0.2.10:30443", out), spread(true, lokAll...)},
	{"Local policy with a local endpoint: ClusterIP to all", pkt(lb.TCP, "10.96.0.14:443", pre), spread(false, lokAll...)},

	{"UDP ClusterIP", pkt(lb.UDP, "10.96.0.53:53", pre), spread(false, dns...)},
	{"UDP ClusterIP from the node", pkt(lb.UDP, "10.96.0.53:53", out), spread(false, dns...)},
	{"UDP NodePort", pkt(lb.UDP, "192.0.2.10:30053", pre), spread(true, dns...)},
	{"UDP NodePort over IPv6: no IPv6 endpoints, rejected", pkt(lb.UDP, "[2001:db8::10]:30053", pre), rejected},
	{"TCP to a UDP frontend", pkt(lb.TCP, "10.96.0.53:53", pre), accepted},

	{"SCTP ClusterIP from a pod", pkt(lb.SCTP, "10.96.0.38:3868", pre), spread(false, diameter...)},
	{"SCTP ClusterIP from the node", pkt(lb.SCTP, "10.96.0.38:3868", out), spread(false, diameter...)},
	{"SCTP NodePort", pkt(lb.SCTP, "192.0.2.10:30868", pre), spread(true, diameter...)},
	{"SCTP NodePort from the node", pkt(lb.SCTP, "198.51.100.10:30868", out), spread(true, diameter...)},
	{"SCTP NodePort on an address not the node's", pkt(lb.SCTP, "192.0.2.99:30868", pre), accepted},
	{"TCP to an SCTP frontend", pkt(lb.TCP, "10.96.0.38:3868", pre), accepted},
	{"UDP to an SCTP NodePort", pkt(lb.UDP, "192.0.2.10:30868", pre), accepted},
	{"SCTP to a TCP frontend", pkt(lb.SCTP, "10.96.0.10:80", pre), accepted},
	{"SCTP to a TCP NodePort", pkt(lb.SCTP, "192.0.2.10:30080", pre), accepted},
	{"no endpoints SCTP ClusterIP", pkt(lb.SCTP, "10.96.0.39:3868", pre), rejected},
	{"no endpoints SCTP NodePort", pkt(lb.SCTP, "192.0.2.10:30869", pre), rejected},

	{"no endpoints TCP from a pod", pkt(lb.TCP, "10.96.0.12:80", pre), rejected},
	{"no endpoints TCP from the node", pkt(lb.TCP, "10.96.0.12:80", out), rejected},
	{"no endpoints IPv6", pkt(lb.TCP, "[fd00::12]:80", pre), rejected},
	{"no endpoints UDP", pkt(lb.UDP, "10.96.0.13:53", pre), rejected},
	{"no endpoints UDP from the node", pkt(lb.UDP, "10.96.0.13:53", out), rejected},
	{"no endpoints NodePort", pkt(lb.TCP, "192.0.2.10:30082", pre), rejected},
	{"no endpoints NodePort from the node", pkt(lb.TCP, "198.51.100.10:30082", out), rejected},

	{"affinity Service, first connection: spread", pkt(lb.TCP, "10.96.0.15:80", pre), spread(false, sticky...)},
	{"affinity NodePort", pkt(lb.TCP, "192.0.2.10:30015", pre), spread(true, sticky...)},

	{"unrelated port on a ClusterIP", pkt(lb.TCP, "10.96.0.10:81", pre), accepted},
	{"unrelated address", pkt(lb.TCP, "8.8.8.8:443", out), accepted},
	{"unrelated IPv6", pkt(lb.UDP, "[2001:4860::8888]:53", out), accepted},
	{"unrelated local port", pkt(lb.TCP, "192.0.2.10:22", pre), accepted},
}

func TestServices(t *testing.T) {
	m, f := newFakeMode(t, Config{IPv6: true})
	mustApply(t, m, store(t, testServices()...).Snapshot(), true)
	for _, tc := range serviceCases {
		t.Run(tc.name, func(t *testing.T) { checkTrace(t, f, tc.p, tc.want) })
	}
	t.Logf("rules for the example:\n%s", f.Dump())
}

func TestHairpin(t *testing.T) {
	m, f := newFakeMode(t, Config{IPv6: true})
	mustApply(t, m, store(t, testServices()...).Snapshot(), true)
	for _, tc := range []struct {
		name string
		p    netfiltertest.Packet
	}{
		{"ClusterIP", from(pkt(lb.TCP, "10.96.0.10:80", pre), "10.244.1.2:5555")},
		{"IPv6 ClusterIP", from(pkt(lb.TCP, "[fd00::10]:80", pre), "[fd00:244::1:1]:5555")},
		{"UDP ClusterIP", from(pkt(lb.UDP, "10.96.0.53:53", pre), "10.244.3.1:5555")},
		{"SCTP ClusterIP", from(pkt(lb.SCTP, "10.96.0.38:3868", pre), "10.244.7.2:5555")},
		{"Local policy ExternalIP", from(pkt(lb.TCP, "203.0.113.14:443", pre), "10.244.4.1:5555")},
		{"affinity", from(pkt(lb.TCP, "10.96.0.15:80", pre), "10.244.6.3:5555")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outs := f.TraceAll(tc.p)
			self := 0
			for _, o := range outs {
				isSelf := o.Dst.Addr() == tc.p.Src.Addr()
				if isSelf {
					self++
				}
				if o.Masquerade != isSelf {
					t.Errorf("%v: masquerade %v, want it exactly when the pod reaches itself", o.Verdict, o.Masquerade)
				}
			}
			if self != 1 {
				t.Errorf("outcomes %v: want exactly one to the pod itself", outs)
			}
		})
	}
}

// TestShortCircuit: with ClusterCIDRs, a pod reaching an external address
// of a Service whose external policy is Local gets every node's endpoints
// with its address kept, as kube-proxy short-circuits it; a client outside
// the cluster still gets this node's endpoints alone, or a rejection.
func TestShortCircuit(t *testing.T) {
	cidr := Config{ClusterCIDRs: []netip.Prefix{podCIDR}}
	outside := func(p netfiltertest.Packet) netfiltertest.Packet { return from(p, "192.0.2.77:999") }
	for _, tc := range []struct {
		name string
		cfg  Config
		p    netfiltertest.Packet
		want want
	}{
		{"no local endpoint: LB IP from a pod", cidr, pkt(lb.TCP, "203.0.113.21:80", pre), spread(false, local...)},
		{"no local endpoint: NodePort from a pod", cidr, pkt(lb.TCP, "192.0.2.10:30081", pre), spread(false, local...)},
		{"no local endpoint: LB IP from outside", cidr, outside(pkt(lb.TCP, "203.0.113.21:80", pre)), rejected},
		{"no local endpoint: NodePort from outside", cidr, outside(pkt(lb.TCP, "192.0.2.10:30081", pre)), rejected},
		{"no local endpoint: the node", cidr, pkt(lb.TCP, "203.0.113.21:80", out), spread(true, local...)},
		{"a local endpoint: ExternalIP from a pod", cidr, pkt(lb.TCP, "203.0.113.14:443", pre), spread(false, lokAll...)},
		{"a local endpoint: NodePort from a pod", cidr, pkt(lb.TCP, "198.51.100.10:30443", pre), spread(false, lokAll...)},
		{"a local endpoint: ExternalIP from outside", cidr, outside(pkt(lb.TCP, "203.0.113.14:443", pre)), spread(false, lokHere...)},
		{"MasqueradeAll: a pod keeps its address", Config{ClusterCIDRs: cidr.ClusterCIDRs, MasqueradeAll: true}, pkt(lb.TCP, "203.0.113.21:80", pre), spread(false, local...)},
		{"MasqueradeAll: a pod, the short circuit through the ClusterIP's chain", Config{ClusterCIDRs: cidr.ClusterCIDRs, MasqueradeAll: true}, pkt(lb.TCP, "203.0.113.14:443", pre), spread(false, lokAll...)},
		{"MasqueradeAll: the node, masqueraded", Config{ClusterCIDRs: cidr.ClusterCIDRs, MasqueradeAll: true}, pkt(lb.TCP, "203.0.113.21:80", out), spread(true, local...)},
		{"a ClusterCIDR of the other family: IPv4 pods not told", Config{IPv6: true, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:244::/64")}}, pkt(lb.TCP, "203.0.113.21:80", pre), rejected},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, f := newFakeMode(t, tc.cfg)
			mustApply(t, m, store(t, testServices()...).Snapshot(), true)
			checkTrace(t, f, tc.p, tc.want)
		})
	}
}

func TestMasquerade(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		p    netfiltertest.Packet
		want want
	}{
		{"ClusterCIDR: from a pod, kept", Config{ClusterCIDRs: []netip.Prefix{podCIDR}}, pkt(lb.TCP, "10.96.0.10:80", pre), spread(false, web4...)},
		{"ClusterCIDR: from the node, masqueraded", Config{ClusterCIDRs: []netip.Prefix{podCIDR}}, pkt(lb.TCP, "10.96.0.10:80", out), spread(true, web4...)},
		{"ClusterCIDR: from outside the cluster, masqueraded", Config{ClusterCIDRs: []netip.Prefix{podCIDR}}, from(pkt(lb.TCP, "10.96.0.10:80", pre), "192.0.2.77:999"), spread(true, web4...)},
		{"ClusterCIDR of the other family: IPv6 kept", Config{IPv6: true, ClusterCIDRs: []netip.Prefix{podCIDR}}, pkt(lb.TCP, "[fd00::10]:80", out), spread(false, web6...)},
		{"ClusterCIDR: Local policy keeps the client", Config{ClusterCIDRs: []netip.Prefix{podCIDR}}, from(pkt(lb.TCP, "203.0.113.14:443", pre), "192.0.2.77:999"), spread(false, lokHere...)},
		{"ClusterCIDR: affinity Service", Config{ClusterCIDRs: []netip.Prefix{podCIDR}}, pkt(lb.TCP, "10.96.0.15:80", out), spread(true, sticky...)},
		{"MasqueradeAll: ClusterIP from a pod", Config{MasqueradeAll: true}, pkt(lb.TCP, "10.96.0.10:80", pre), spread(true, web4...)},
		{"MasqueradeAll: Local policy keeps the client", Config{MasqueradeAll: true}, from(pkt(lb.TCP, "203.0.113.14:443", pre), "192.0.2.77:999"), spread(false, lokHere...)},
		{"MasqueradeAll: Cluster policy external, masqueraded", Config{MasqueradeAll: true}, from(pkt(lb.TCP, "203.0.113.10:80", pre), "192.0.2.77:999"), spread(true, web4...)},
		{"MasqueradeAll: ClusterIP from outside", Config{MasqueradeAll: true}, from(pkt(lb.TCP, "10.96.0.10:80", pre), "192.0.2.77:999"), spread(true, web4...)},
		{"other mark", Config{Mark: 0x1}, pkt(lb.TCP, "203.0.113.10:80", pre), spread(true, web4...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, f := newFakeMode(t, tc.cfg)
			mustApply(t, m, store(t, testServices()...).Snapshot(), true)
			checkTrace(t, f, tc.p, tc.want)
		})
	}
	// A packet already carrying the forwarder's mark is not masqueraded
	// for it, and marks do not leak: the bit is cleared after use.
	m, f := newFakeMode(t, Config{})
	mustApply(t, m, store(t, testServices()...).Snapshot(), true)
	p := pkt(lb.TCP, "10.96.0.10:80", out)
	p.Mark = 0x80000
	checkTrace(t, f, p, spread(false, web4...))
}

func TestNodePortAddresses(t *testing.T) {
	for _, tc := range []struct {
		name     string
		prefixes []netip.Prefix
		dst      string
		hook     netfiltertest.Hook
		want     want
	}{
		{"inside", []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, "192.0.2.10:30080", pre, spread(true, web4...)},
		{"local but outside", []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, "198.51.100.10:30080", pre, accepted},
		{"localhost inside: still never", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, "127.0.0.1:30080", out, accepted},
		{"inside but not local", []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, "192.0.2.99:30080", pre, accepted},
		{"host prefix", []netip.Prefix{netip.MustParsePrefix("198.51.100.10/32")}, "198.51.100.10:30080", pre, spread(true, web4...)},
		{"dead NodePort inside", []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, "192.0.2.10:30082", pre, rejected},
		{"dead NodePort outside", []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, "198.51.100.10:30082", pre, accepted},
		{"no IPv6 prefix: no IPv6 NodePorts", []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, "[2001:db8::10]:30080", pre, accepted},
		{"IPv6 prefix", []netip.Prefix{netip.MustParsePrefix("2001:db8::/64")}, "[2001:db8::10]:30080", pre, spread(true, web6...)},
		{"IPv4 /0 lifts the IPv4 restriction", []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("2001:db8::/64")}, "198.51.100.10:30080", pre, spread(true, web4...)},
		{"ClusterIPs are not restricted", []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, "10.96.0.10:80", pre, spread(false, web4...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, f := newFakeMode(t, Config{IPv6: true, NodePortAddresses: tc.prefixes})
			mustApply(t, m, store(t, testServices()...).Snapshot(), true)
			checkTrace(t, f, pkt(lb.TCP, tc.dst, tc.hook), tc.want)
		})
	}
}

func TestIPv6Off(t *testing.T) {
	m, f := newFakeMode(t, Config{})
	mustApply(t, m, store(t, testServices()...).Snapshot(), true)
	checkTrace(t, f, pkt(lb.TCP, "10.96.0.10:80", pre), spread(false, web4...))
	checkTrace(t, f, pkt(lb.TCP, "[fd00::10]:80", pre), accepted)
	checkTrace(t, f, pkt(lb.TCP, "[fd00::12]:80", pre), accepted)
	checkTrace(t, f, pkt(lb.TCP, "[2001:db8::10]:30080", pre), accepted)
	for _, c := range f.Calls() {
		if c.Family == netfilter.IPv6 && strings.HasPrefix(c.Op, "iptables-") && c.Op != "iptables-version" {
			t.Errorf("IPv6 off, but called %s for IPv6", c.Op)
		}
	}
}

func TestAffinity(t *testing.T) {
	m, f := newFakeMode(t, Config{})
	st := store(t, testServices()...)
	mustApply(t, m, st.Snapshot(), true)
	p := pkt(lb.TCP, "10.96.0.15:80", pre)
	first := f.Trace(p)
	if first.Action != netfiltertest.DNAT || !slices.Contains(sticky, first.Dst.String()) {
		t.Fatalf("first connection: %v", first)
	}
	for range 10 {
		if v := f.Trace(p); v.Dst != first.Dst {
			t.Fatalf("affinity broken: %v, then %v", first, v)
		}
	}
	checkTrace(t, f, p, spread(false, first.Dst.String()))
	// The same client through the NodePort is another frontend of the same
	// Service: kube-proxy's lists are per endpoint, so it sticks there too.
	checkTrace(t, f, pkt(lb.TCP, "192.0.2.10:30015", pre), spread(true, first.Dst.String()))
	// Another client is free.
	checkTrace(t, f, from(p, "10.244.9.9:1"), spread(false, sticky...))
	// Within the timeout it sticks; after it, it is free again.
	f.Advance(29 * time.Second)
	checkTrace(t, f, p, spread(false, first.Dst.String()))
	f.Advance(2 * time.Second)
	checkTrace(t, f, p, spread(false, sticky...))

	// Its endpoint removed: the client goes elsewhere, and sticks there.
	v := f.Trace(p)
	svcs := testServices()
	sv := &svcs[6]
	sv.Endpoints = slices.DeleteFunc(sv.Endpoints, func(e lb.Endpoint) bool { return e.Addr == v.Dst })
	snap, err := st.Update([]lb.Service{*sv}, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, m, snap, false)
	var rest []string
	for _, e := range sv.Endpoints {
		rest = append(rest, e.Addr.String())
	}
	checkTrace(t, f, p, spread(false, rest...))
	again := f.Trace(p)
	checkTrace(t, f, p, spread(false, again.Dst.String()))
}

// TestIncremental checks that an incremental Apply writes only what
// changed: the changed Services' chains, and single rules inserted into and
// deleted from the shared chains.
func TestIncremental(t *testing.T) {
	ctx := context.Background()
	m, f := newFakeMode(t, Config{IPv6: true})
	st := store(t, testServices()...)
	mustApply(t, m, st.Snapshot(), true)
	if n := f.CountCalls("iptables-restore"); n != 2 {
		t.Errorf("full sync: %d iptables-restore calls, want one per family", n)
	}
	svcs := testServices()

	type step struct {
		name    string
		upserts []lb.Service
		deletes []string
		// per family: lines the restore input must hold and must not
		// ("" family entry: no restore for it at all)
		want4, want6 []string
		not4         []string
		ipset        bool // an ipset restore (hairpin members)
	}
	webChain := chainName(kindService, &svcs[0], netip.AddrPort{})
	added := lb.Service{Name: svcName("added"), Port: 443, ClusterIPs: []netip.Addr{ip("10.96.1.1")}, Endpoints: eps(9, 3, "")}
	addedChain := chainName(kindService, &added, netip.AddrPort{})
	webOne := svcs[0]
	webOne.Endpoints = slices.Concat(eps(1, 1, "node-b"), eps6(1, 2, "node-b"))
	emptyAlive := svcs[3]
	emptyAlive.Endpoints = eps(7, 1, "")
	emptyAliveS := chainName(kindService, &emptyAlive, netip.AddrPort{})

	for _, s := range []step{
		{name: "nothing changed"},
		{name: "one endpoint removed: one chain rewritten, nothing else", upserts: []lb.Service{webOne},
			want4: []string{":" + webChain + " - [0:0]", "-A " + webChain + " -p tcp -j DNAT --to-destination 10.244.1.1:8080"},
			not4:  []string{chainServices, chainNodePorts, chainReject, "10.244.1.2"}, ipset: true},
		{name: "endpoints back", upserts: []lb.Service{svcs[0]},
			want4: []string{":" + webChain + " - [0:0]", "--probability 0.50000000000 -j DNAT --to-destination 10.244.1.1:8080"}, ipset: true},
		{name: "Service added: its chain and one inserted dispatch rule", upserts: []lb.Service{added},
			want4: []string{":" + addedChain + " - [0:0]", "-I " + chainServices + " 1 -d 10.96.1.1/32 -p tcp -m tcp --dport 443 -j " + addedChain},
			not4:  []string{"-D ", webChain}, ipset: true},
		{name: "Service removed: its dispatch rule deleted, its chain removed", deletes: []string{"added"},
			want4: []string{"-D " + chainServices + " -d 10.96.1.1/32 -p tcp -m tcp --dport 443 -j " + addedChain, "-X " + addedChain},
			not4:  []string{"-I ", webChain}, ipset: true},
		{name: "endpoints appear: RETURN and REJECT replaced, chains created", upserts: []lb.Service{emptyAlive},
			want4: []string{"-D " + chainServices + " -d 10.96.0.12/32 -p tcp -m tcp --dport 80 -j RETURN",
				"-I " + chainServices + " 1 -d 10.96.0.12/32 -p tcp -m tcp --dport 80 -j " + emptyAliveS,
				"-D " + chainReject + " -d 10.96.0.12/32 -p tcp -m tcp --dport 80 -j REJECT --reject-with tcp-reset",
				"-D " + chainNPReject + " -p tcp -m tcp --dport 30082 -j REJECT --reject-with tcp-reset",
				"-A " + chainNodePorts + " -p tcp -m tcp --dport 30082 -j "},
			ipset: true},
		{name: "endpoints go again", upserts: []lb.Service{svcs[3]},
			want4: []string{"-X " + emptyAliveS, "-A " + chainReject + " -d 10.96.0.12/32 -p tcp -m tcp --dport 80 -j REJECT --reject-with tcp-reset"},
			ipset: true},
		{name: "IPv6 endpoint removed: only ip6tables", upserts: []lb.Service{func() lb.Service {
			s := svcs[0]
			s.Endpoints = slices.Concat(eps(1, 2, "node-b"), eps6(1, 1, "node-b"))
			return s
		}()}, want6: []string{":" + webChain + " - [0:0]"}, ipset: true},
	} {
		t.Run(s.name, func(t *testing.T) {
			var names []lb.ServicePortName
			for _, d := range s.deletes {
				names = append(names, svcName(d))
			}
			snap, err := st.Update(s.upserts, names)
			if err != nil {
				t.Fatal(err)
			}
			f.ResetCalls()
			if err := m.Apply(ctx, snap, false); err != nil {
				t.Fatal(err)
			}
			var in [2]string
			var restores [2]int
			ipsets := 0
			for _, c := range f.Calls() {
				switch c.Op {
				case "iptables-restore":
					in[c.Family] = c.Data
					restores[c.Family]++
				case "ipset-restore":
					ipsets++
				default:
					t.Errorf("incremental sync called %s", c.Op)
				}
			}
			for fam, wants := range [][]string{s.want4, s.want6} {
				if len(wants) == 0 && restores[fam] != 0 {
					t.Errorf("%v: restored without a change:\n%s", netfilter.Family(fam), in[fam])
				}
				if len(wants) > 0 && restores[fam] != 1 {
					t.Errorf("%v: %d restores, want 1", netfilter.Family(fam), restores[fam])
				}
				for _, w := range wants {
					if !strings.Contains(in[fam], w) {
						t.Errorf("%v restore input lacks %q:\n%s", netfilter.Family(fam), w, in[fam])
					}
				}
			}
			for _, n := range s.not4 {
				if strings.Contains(in[0], n) {
					t.Errorf("restore input has %q, which did not change:\n%s", n, in[0])
				}
			}
			if (ipsets > 0) != s.ipset {
				t.Errorf("%d ipset restores, want some: %v", ipsets, s.ipset)
			}
			if d := traceDiff(f, pkt(lb.TCP, "10.96.0.10:80", pre), spread(false, web4...)); d != "" && s.name != "one endpoint removed: one chain rewritten, nothing else" {
				t.Errorf("web after the step: %s", d)
			}
		})
	}
	checkTrace(t, f, pkt(lb.TCP, "10.96.1.1:443", pre), accepted)
	checkTrace(t, f, pkt(lb.TCP, "10.96.0.12:80", pre), rejected)
	checkTrace(t, f, pkt(lb.TCP, "192.0.2.10:30082", pre), rejected)
	checkTrace(t, f, pkt(lb.TCP, "[fd00::10]:80", pre), spread(false, web6[0]))

	// A full sync now finds exactly what the incremental ones wrote (in
	// another order in the shared chains) and counts no repair.
	mustApply(t, m, st.Snapshot(), true)
	if m.Repairs() != 0 {
		t.Errorf("Repairs = %d after incremental syncs", m.Repairs())
	}
}

// TestUDPConntrack: a UDP endpoint leaving its frontends clears the
// conntrack entries DNATing flows to it (at the ClusterIP and, by port, at
// any node address of the NodePort), in one read of the table; nothing
// else does, and a failing table does not fail the sync.
func TestUDPConntrack(t *testing.T) {
	ct := &conntracktest.Table{}
	m, _ := newFakeMode(t, Config{IPv6: true, Conntrack: ct})
	st := store(t, testServices()...)
	mustApply(t, m, st.Snapshot(), true)
	svcs := testServices()
	flow := func(proto lb.Protocol, dst, ep string) conntrack.Flow {
		return conntrack.Flow{Proto: proto, OrigSrc: ap("10.244.9.9:5353"), OrigDst: ap(dst), ReplySrc: ap(ep)}
	}
	flows := []conntrack.Flow{
		flow(lb.UDP, "10.96.0.53:53", dns[0]),
		flow(lb.UDP, "10.96.0.53:53", dns[1]),
		flow(lb.UDP, "192.0.2.10:30053", dns[0]),
		flow(lb.UDP, "198.51.100.7:30053", dns[1]),
		flow(lb.TCP, "10.96.0.10:80", web4[0]),
	}
	ct.Add(netfilter.IPv4, flows...)
	// want: the flows deleted; reads: how many times the table is read
	// (once for the removed endpoints' flows, once for the flows that
	// reached frontends just served).
	step := func(name string, want []int, reads int, upserts []lb.Service, deletes ...string) {
		t.Helper()
		var names []lb.ServicePortName
		for _, d := range deletes {
			names = append(names, svcName(d))
		}
		snap, err := st.Update(upserts, names)
		if err != nil {
			t.Fatal(err)
		}
		readsBefore, countBefore := ct.Deletes(), m.ConntrackDeleted(netfilter.IPv4)
		mustApply(t, m, snap, false)
		left := ct.Flows(netfilter.IPv4)
		var got []int
		for i, f := range flows {
			if !slices.Contains(left, f) {
				got = append(got, i)
				ct.Add(netfilter.IPv4, f) // back for the next step
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: deleted flows %v, want %v", name, got, want)
		}
		if n := ct.Deletes() - readsBefore; n != reads {
			t.Errorf("%s: %d reads of the table, want %d", name, n, reads)
		}
		if n := m.ConntrackDeleted(netfilter.IPv4) - countBefore; n != uint64(len(want)) {
			t.Errorf("%s: ConntrackDeleted counted %d, want %d", name, n, len(want))
		}
	}
	dnsSvc := svcs[2]
	dnsSvc.Endpoints = dnsSvc.Endpoints[1:]
	step("UDP endpoint removed", []int{0, 2}, 1, []lb.Service{dnsSvc})
	step("UDP endpoint back", nil, 0, []lb.Service{svcs[2]})
	web := svcs[0]
	web.Endpoints = web.Endpoints[1:]
	step("TCP endpoint removed", nil, 0, []lb.Service{web})
	step("UDP Service removed", []int{0, 1, 2, 3}, 1, nil, "dns")
	step("UDP Service back", nil, 2, []lb.Service{svcs[2]}) // its frontends are served anew: its NodePort in both families
	ct.FailNext(errors.New("no ctnetlink"))
	step("a failing conntrack table does not fail the sync", nil, 1, []lb.Service{dnsSvc})
}

// TestRemovals: removing endpoints and Services through incremental syncs
// leaves exactly what a full sync of the result would.
func TestRemovals(t *testing.T) {
	m, f := newFakeMode(t, Config{IPv6: true})
	st := store(t, testServices()...)
	mustApply(t, m, st.Snapshot(), true)
	svcs := testServices()
	web := svcs[0]
	web.Endpoints = web.Endpoints[1:]
	snap, _ := st.Update([]lb.Service{web}, []lb.ServicePortName{svcName("sticky"), svcName("dns")})
	mustApply(t, m, snap, false)
	checkTrace(t, f, pkt(lb.TCP, "10.96.0.10:80", pre), spread(false, web4[1]))
	checkTrace(t, f, pkt(lb.TCP, "203.0.113.10:80", pre), spread(true, web4[1]))
	for _, p := range []netfiltertest.Packet{pkt(lb.TCP, "10.96.0.15:80", pre), pkt(lb.UDP, "10.96.0.53:53", pre), pkt(lb.UDP, "192.0.2.10:30053", pre), pkt(lb.TCP, "192.0.2.10:30015", out)} {
		checkTrace(t, f, p, accepted)
	}
	incremental := f.Dump()

	m2, f2 := newFakeMode(t, Config{IPv6: true})
	mustApply(t, m2, snap, true)
	if got, want := sortedLines(incremental), sortedLines(f2.Dump()); got != want {
		t.Errorf("incremental result:\n%s\nfull sync of the same snapshot:\n%s", incremental, f2.Dump())
	}
}

func sortedLines(s string) string {
	lines := strings.Split(s, "\n")
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// TestRepair tampers with the fake between full syncs. The periodic check
// finds what happened to the fixed chains, the jumps and the sets at the
// next full Apply; what happened inside a Service's chain or a set's members
// (hourly) waits for the full sync after Config.FullSyncPeriod.
func TestRepair(t *testing.T) {
	ctx := context.Background()
	v4, v6 := netfilter.IPv4, netfilter.IPv6
	for _, tc := range []struct {
		name   string
		tamper func(f *netfiltertest.Fake) error
		broken netfiltertest.Packet // a packet the tampering misroutes
		hourly bool                 // the check does not see it; the hourly full sync repairs it
	}{
		{"dispatch chain flushed", func(f *netfiltertest.Fake) error {
			return f.IPTablesRestore(ctx, v4, []byte("*nat\n-F "+chainServices+"\nCOMMIT\n"))
		}, pkt(lb.TCP, "10.96.0.10:80", pre), false},
		{"service chain flushed", func(f *netfiltertest.Fake) error {
			c := chainName(kindService, &testServices()[0], netip.AddrPort{})
			return f.IPTablesRestore(ctx, v4, []byte("*nat\n-F "+c+"\nCOMMIT\n"))
		}, pkt(lb.TCP, "10.96.0.10:80", pre), true},
		{"reject rule deleted", func(f *netfiltertest.Fake) error {
			return f.IPTablesRestore(ctx, v4, []byte("*filter\n-D "+chainReject+" -d 10.96.0.12/32 -p tcp -m tcp --dport 80 -j REJECT --reject-with tcp-reset\nCOMMIT\n"))
		}, pkt(lb.TCP, "10.96.0.12:80", pre), false},
		{"jump deleted", func(f *netfiltertest.Fake) error {
			return f.IPTablesRestore(ctx, v6, []byte("*nat\n-D OUTPUT -j "+chainServices+"\nCOMMIT\n"))
		}, pkt(lb.TCP, "[fd00::10]:80", out), false},
		{"masquerade jump deleted", func(f *netfiltertest.Fake) error {
			return f.IPTablesRestore(ctx, v4, []byte("*nat\n-D POSTROUTING -j "+chainPost+"\nCOMMIT\n"))
		}, pkt(lb.TCP, "203.0.113.10:80", pre), false},
		{"rule inserted before ours", func(f *netfiltertest.Fake) error {
			return f.IPTablesRestore(ctx, v4, []byte("*nat\n-I "+chainServices+" 1 -j RETURN\nCOMMIT\n"))
		}, pkt(lb.TCP, "10.96.0.10:80", out), false},
		{"hairpin member deleted", func(f *netfiltertest.Fake) error {
			return f.IPSetRestore(ctx, []byte("del svcproxy-dnat-hairpin-v4 10.244.1.1,tcp:8080,10.244.1.1\n"))
		}, from(pkt(lb.TCP, "10.96.0.10:80", pre), "10.244.1.1:5"), true},
		{"stray chain and set", func(f *netfiltertest.Fake) error {
			return errors.Join(
				f.IPSetRestore(ctx, []byte("create svcproxy-dnat-old hash:ip,port family inet\nadd svcproxy-dnat-old 8.8.8.8,tcp:443\n")),
				f.IPTablesRestore(ctx, v4, []byte("*nat\n:SVCPROXY-DNAT-OLD - [0:0]\n-A SVCPROXY-DNAT-OLD -p tcp -m set --match-set svcproxy-dnat-old dst,dst -j DNAT --to-destination 10.0.0.1:1\n-I PREROUTING 1 -j SVCPROXY-DNAT-OLD\nCOMMIT\n")))
		}, pkt(lb.TCP, "8.8.8.8:443", pre), false},
		{"duplicate jump", func(f *netfiltertest.Fake) error {
			return f.IPTablesRestore(ctx, v4, []byte("*filter\n-A INPUT -j "+chainFilter+"\n-A INPUT -s 10.0.0.0/8 -j "+chainFilter+"\nCOMMIT\n"))
		}, netfiltertest.Packet{}, false},
		{"set destroyed", func(f *netfiltertest.Fake) error {
			return errors.Join(
				f.IPTablesRestore(ctx, v6, []byte("*nat\n-F "+chainPost+"\nCOMMIT\n")),
				f.IPSetDestroy(ctx, "svcproxy-dnat-hairpin-v6"))
		}, netfiltertest.Packet{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, f := newFakeMode(t, Config{IPv6: true})
			snap := store(t, testServices()...).Snapshot()
			mustApply(t, m, snap, true)
			clean := f.Dump()
			check := tc.broken.Dst.IsValid()
			var before []netfiltertest.Outcome
			if check {
				before = f.TraceAll(tc.broken)
			}
			if err := tc.tamper(f); err != nil {
				t.Fatalf("tampering: %v", err)
			}
			if check && slices.EqualFunc(before, f.TraceAll(tc.broken), func(a, b netfiltertest.Outcome) bool { return a.Verdict.String() == b.Verdict.String() }) {
				t.Fatalf("tampering did not change where %v goes: the test tests nothing", tc.broken.Dst)
			}
			mustApply(t, m, snap, false)
			if m.Repairs() != 0 {
				t.Errorf("an incremental sync counted a repair")
			}
			mustApply(t, m, snap, true)
			if tc.hourly {
				if m.Repairs() != 0 {
					t.Errorf("Repairs = %d: the check within the full-sync period found it", m.Repairs())
				}
				m.now = func() time.Time { return time.Now().Add(time.Hour) }
				mustApply(t, m, snap, true)
			}
			if m.Repairs() != 1 {
				t.Errorf("Repairs = %d, want 1", m.Repairs())
			}
			if got := f.Dump(); got != clean {
				t.Errorf("after repair:\n%s\nwant:\n%s", got, clean)
			}
			mustApply(t, m, snap, true)
			if m.Repairs() != 1 {
				t.Errorf("Repairs = %d after a clean full sync, want still 1", m.Repairs())
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
	m, f := newFakeMode(t, Config{IPv6: true, NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/64")}})
	if err := f.IPSetRestore(ctx, []byte("create foreign-set hash:net family inet\nadd foreign-set 10.0.0.0/8\n")); err != nil {
		t.Fatal(err)
	}
	if err := f.IPTablesRestore(ctx, netfilter.IPv4, []byte(foreignNat)); err != nil {
		t.Fatal(err)
	}
	// The redirect mode's rules are not this mode's to remove.
	if err := f.IPTablesRestore(ctx, netfilter.IPv4, []byte("*nat\n:SVCPROXY-SERVICES - [0:0]\n-A PREROUTING -j SVCPROXY-SERVICES\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	before := f.Dump()
	mustApply(t, m, store(t, testServices()...).Snapshot(), true)
	checkTrace(t, f, pkt(lb.TCP, "203.0.113.10:80", pre), spread(true, web4...))
	// Rules of another process in the foreign chain jumping into ours.
	if err := f.IPTablesRestore(ctx, netfilter.IPv4, []byte("*nat\n-A FOREIGN -j "+chainServices+"\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	if err := m.Cleanup(ctx); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if got := f.Dump(); got != before {
		t.Errorf("after Cleanup:\n%s\nbefore the first Apply:\n%s", got, before)
	}

	// Cleanup by a process that installed nothing (svcproxy --cleanup).
	mustApply(t, m, store(t, testServices()...).Snapshot(), true)
	other, err := New(Config{Exec: f, Conntrack: &conntracktest.Table{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Cleanup(ctx); err != nil {
		t.Fatalf("Cleanup by another Mode: %v", err)
	}
	if got := f.Dump(); got != before {
		t.Errorf("after Cleanup by another process (IPv6 off there):\n%s\nwant:\n%s", got, before)
	}
	if err := other.Cleanup(ctx); err != nil {
		t.Errorf("second Cleanup: %v", err)
	}
	// m did not see that: to it, someone removing its rules is tampering,
	// which its next full sync repairs.
	mustApply(t, m, store(t, testServices()...).Snapshot(), true)
	checkTrace(t, f, pkt(lb.TCP, "10.96.0.10:80", out), spread(false, web4...))
	if m.Repairs() != 1 {
		t.Errorf("Repairs = %d, want 1", m.Repairs())
	}
}

func TestFaults(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")
	svcs := testServices()

	t.Run("incremental failure falls back to a full sync", func(t *testing.T) {
		m, f := newFakeMode(t, Config{})
		st := store(t, svcs...)
		mustApply(t, m, st.Snapshot(), true)
		empty := svcs[3]
		empty.Endpoints = eps(7, 1, "")
		snap, _ := st.Update([]lb.Service{empty}, nil)
		f.FailNext("iptables-restore", boom)
		mustApply(t, m, snap, false)
		checkTrace(t, f, pkt(lb.TCP, "10.96.0.12:80", pre), spread(false, "10.244.7.1:8080"))
		if m.Repairs() != 0 {
			t.Errorf("Repairs = %d; a failed restore is not tampering", m.Repairs())
		}
		if v4, v6 := m.RestoreFailures(netfilter.IPv4), m.RestoreFailures(netfilter.IPv6); v4 != 1 || v6 != 0 {
			t.Errorf("RestoreFailures IPv4 %d, IPv6 %d; want 1, 0", v4, v6)
		}
	})
	t.Run("failed full sync leaves the next Apply full", func(t *testing.T) {
		m, f := newFakeMode(t, Config{})
		st := store(t, svcs...)
		f.FailNext("iptables-restore", boom)
		if err := m.Apply(ctx, st.Snapshot(), true); !errors.Is(err, boom) {
			t.Fatalf("Apply = %v, want boom", err)
		}
		f.ResetCalls()
		mustApply(t, m, st.Snapshot(), false)
		if n := f.CountCalls("iptables-save"); n == 0 {
			t.Errorf("Apply after a failure was not a full sync")
		}
		checkTrace(t, f, pkt(lb.TCP, "10.96.0.10:80", pre), spread(false, web4...))
	})
	t.Run("reading fails", func(t *testing.T) {
		m, f := newFakeMode(t, Config{})
		f.FailNext("iptables-save", boom)
		if err := m.Apply(ctx, store(t, svcs...).Snapshot(), true); !errors.Is(err, boom) {
			t.Fatalf("Apply = %v, want boom", err)
		}
	})
	t.Run("set writing fails", func(t *testing.T) {
		m, f := newFakeMode(t, Config{})
		f.FailNext("ipset-restore", boom)
		if err := m.Apply(ctx, store(t, svcs...).Snapshot(), true); !errors.Is(err, boom) {
			t.Fatalf("Apply = %v, want boom", err)
		}
		mustApply(t, m, store(t, svcs...).Snapshot(), false)
		checkTrace(t, f, pkt(lb.TCP, "10.96.0.10:80", pre), spread(false, web4...))
	})
}

func TestConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Mark: 0x80000},
		{Mark: 0xc0000},
		{Mark: 0x1, AvoidMark: 0x1},
		{NodePortAddresses: []netip.Prefix{{}}},
		{ClusterCIDRs: []netip.Prefix{podCIDR, netip.MustParsePrefix("10.245.0.0/16")}},
		{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}},
	} {
		cfg.Exec = netfiltertest.NewFake()
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
	for v, want := range map[string]struct {
		backend     string
		randomFully bool
	}{
		"iptables v1.8.9 (nf_tables)": {"nf_tables", true},
		"iptables v1.8.9 (legacy)":    {"legacy", true},
		"iptables v1.6.2":             {"legacy", true},
		"iptables v1.6.1":             {"legacy", false},
		"iptables v1.4.21":            {"legacy", false},
	} {
		f := netfiltertest.NewFake()
		f.SetVersion(v)
		m, err := New(Config{Exec: f, Conntrack: &conntracktest.Table{}})
		if err != nil {
			t.Fatal(err)
		}
		if m.Backend() != want.backend || m.randomFully != want.randomFully {
			t.Errorf("%q: backend %q, random-fully %v; want %+v", v, m.Backend(), m.randomFully, want)
		}
		mustApply(t, m, store(t, testServices()...).Snapshot(), true)
		if got := strings.Contains(f.Dump(), "--random-fully"); got != want.randomFully {
			t.Errorf("%q: --random-fully in the rules: %v", v, got)
		}
	}
}

func TestAvailable(t *testing.T) {
	ctx := context.Background()
	m, f := newFakeMode(t, Config{IPv6: true})
	before := f.Dump()
	if err := m.Available(ctx); err != nil {
		t.Fatalf("Available: %v", err)
	}
	if got := f.Dump(); got != before {
		t.Errorf("Available left:\n%s", got)
	}

	// A kernel that refuses --random-fully: masquerade without it.
	m, f = newFakeMode(t, Config{})
	f.FailNext("iptables-restore", errors.New("no random-fully"))
	if err := m.Available(ctx); err != nil {
		t.Fatalf("Available: %v", err)
	}
	mustApply(t, m, store(t, testServices()...).Snapshot(), true)
	if strings.Contains(f.Dump(), "random-fully") {
		t.Errorf("--random-fully still used after the kernel refused it")
	}
	checkTrace(t, f, pkt(lb.TCP, "203.0.113.10:80", pre), spread(true, web4...))

	// Tools that do not work.
	m, f = newFakeMode(t, Config{})
	f.FailNext("ipset-restore", errors.New("no ipset"))
	if err := m.Available(ctx); err == nil {
		t.Error("Available succeeded without ipset")
	}
}

// TestCanonical: every rule the mode writes is in the form iptables-save
// prints, or a full sync would see tampering everywhere.
func TestCanonical(t *testing.T) {
	for _, cfg := range []Config{
		{IPv6: true},
		{IPv6: true, ClusterCIDRs: []netip.Prefix{podCIDR, netip.MustParsePrefix("fd00:244::/64")}},
		{IPv6: true, MasqueradeAll: true, NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/64")}},
	} {
		m, _ := newFakeMode(t, cfg)
		next, _ := m.plan(store(t, testServices()...).Snapshot(), nil)
		for _, fam := range m.families {
			for k, rules := range m.desiredChains(next, fam) {
				if err := canonicalCheck(fam, rules); err != nil {
					t.Errorf("%v %s: %v", fam, k.Chain, err)
				}
			}
		}
	}
}

func TestBadInput(t *testing.T) {
	m, f := newFakeMode(t, Config{})
	if err := m.Apply(context.Background(), nil, true); err == nil {
		t.Error("Apply(nil snapshot) succeeded")
	}
	if len(f.Calls()) != 1 { // New's version check
		t.Errorf("bad input reached the kernel: %v", f.Calls())
	}
}

// TestFrontendConflict: a frontend two Services claim goes to the one the
// snapshot routes it to; the other's rules never mention it.
func TestFrontendConflict(t *testing.T) {
	m, f := newFakeMode(t, Config{})
	a := lb.Service{Name: svcName("a"), Port: 80, ClusterIPs: []netip.Addr{ip("10.96.0.1")}, NodePort: 30000}
	b := lb.Service{Name: svcName("b"), Port: 80, ClusterIPs: []netip.Addr{ip("10.96.0.1")}, NodePort: 30000, Endpoints: eps(1, 1, "")}
	st := lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: nodeName}})
	snap, err := st.Replace([]lb.Service{a, b})
	if err == nil {
		t.Fatal("the store accepted a conflict")
	}
	mustApply(t, m, snap, true)
	checkTrace(t, f, pkt(lb.TCP, "10.96.0.1:80", pre), rejected) // a sorts first, and has no endpoints
	checkTrace(t, f, pkt(lb.TCP, "192.0.2.10:30000", pre), rejected)
	// a goes away: b gets the frontend without b itself changing.
	snap, err = st.Update(nil, []lb.ServicePortName{a.Name})
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, m, snap, false)
	checkTrace(t, f, pkt(lb.TCP, "10.96.0.1:80", pre), spread(false, "10.244.1.1:8080"))
	checkTrace(t, f, pkt(lb.TCP, "192.0.2.10:30000", pre), spread(true, "10.244.1.1:8080"))
}
