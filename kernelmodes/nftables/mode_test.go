package nftables_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/conntrack/conntracktest"
	"github.com/svcproxy/svcproxy/internal/kerneltest"
	"github.com/svcproxy/svcproxy/kernelmodes/nftables"
	"github.com/svcproxy/svcproxy/kernelmodes/nftables/nftablestest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/nftable"
)

const nodeName = "node-a"

var (
	podCIDR  = netip.MustParsePrefix("10.244.0.0/16")
	podIP    = netip.MustParseAddr("10.244.9.9")
	hostIP   = netip.MustParseAddr("192.0.2.77") // off the pod range
	nodeIP   = netip.MustParseAddr("192.0.2.10")
	nodeIP2  = netip.MustParseAddr("198.51.100.10")
	loopback = netip.MustParseAddr("127.0.0.1")
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
func ip(s string) netip.Addr     { return netip.MustParseAddr(s) }

func name(n string) lb.ServicePortName {
	return lb.ServicePortName{Namespace: "default", Name: n, Port: "p"}
}

// eps are ready endpoints at addrs (port 8080), on node (empty: another).
func eps(node string, addrs ...string) []lb.Endpoint {
	var out []lb.Endpoint
	for _, a := range addrs {
		out = append(out, lb.Endpoint{Addr: netip.AddrPortFrom(ip(a), 8080), Ready: true, Serving: true, NodeName: node})
	}
	return out
}

func cluster() []lb.Service {
	return []lb.Service{
		{Name: name("web"), Port: 80, ClusterIPs: []netip.Addr{ip("10.96.0.10"), ip("fd00::10")}, NodePort: 30080,
			ExternalIPs: []netip.Addr{ip("203.0.113.10")},
			Endpoints:   append(eps(nodeName, "10.244.1.1", "10.244.1.2", "fd00:244::1"), eps("node-b", "10.244.2.1")...)},
		{Name: name("local"), Port: 80, ClusterIPs: []netip.Addr{ip("10.96.0.20")}, NodePort: 30081, ExternalIPs: []netip.Addr{ip("203.0.113.20")},
			ExternalTrafficPolicy: lb.PolicyLocal, Endpoints: append(eps(nodeName, "10.244.1.3"), eps("node-b", "10.244.2.3")...)},
		{Name: name("remote-only"), Port: 80, ClusterIPs: []netip.Addr{ip("10.96.0.30")}, NodePort: 30082,
			ExternalTrafficPolicy: lb.PolicyLocal, Endpoints: eps("node-b", "10.244.2.4")},
		{Name: name("empty"), Port: 53, Protocol: lb.UDP, ClusterIPs: []netip.Addr{ip("10.96.0.40")}, NodePort: 30053},
		{Name: name("dns"), Port: 53, Protocol: lb.UDP, ClusterIPs: []netip.Addr{ip("10.96.0.53")}, Endpoints: eps(nodeName, "10.244.1.53", "10.244.1.54")},
		{Name: name("sctp"), Port: 9999, Protocol: lb.SCTP, ClusterIPs: []netip.Addr{ip("10.96.0.60")}, Endpoints: eps(nodeName, "10.244.1.60")},
	}
}

func snapshot(t testing.TB, st *lb.Store, services []lb.Service) *lb.Snapshot {
	t.Helper()
	snap, err := st.Replace(services)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func newMode(t testing.TB, cfg nftables.Config) (*nftables.Mode, *nftablestest.Fake, *lb.Store) {
	t.Helper()
	fake := nftablestest.New()
	cfg.Kernel = fake
	cfg.Logger = zaptest.NewLogger(t)
	if cfg.Conntrack == nil {
		cfg.Conntrack = &conntracktest.Table{}
	}
	m, err := nftables.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m, fake, lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: nodeName}})
}

func share(ep string, n, of int) nftablestest.Share {
	return nftablestest.Share{Endpoint: ap(ep), Slots: n, Of: of}
}

// TestTrace: a packet from A to B:port goes where? One case per Service
// kind, policy and outcome, in both families.
func TestTrace(t *testing.T) {
	m, fake, st := newMode(t, nftables.Config{IPv6: true, ClusterCIDRs: []netip.Prefix{podCIDR}})
	if err := m.Apply(context.Background(), snapshot(t, st, cluster()), true); err != nil {
		t.Fatal(err)
	}
	all3 := []nftablestest.Share{share("10.244.1.1:8080", 1, 3), share("10.244.1.2:8080", 1, 3), share("10.244.2.1:8080", 1, 3)}
	for _, tc := range []struct {
		name string
		fam  netfilter.Family
		p    nftablestest.Packet
		want nftablestest.Verdict
	}{
		{"ClusterIP from a pod: spread, client kept", netfilter.IPv4,
			nftablestest.Packet{Src: podIP, Dst: ap("10.96.0.10:80")}, nftablestest.Verdict{DNAT: all3}},
		{"ClusterIP from off the pod range: masqueraded", netfilter.IPv4,
			nftablestest.Packet{Src: hostIP, Dst: ap("10.96.0.10:80")}, nftablestest.Verdict{DNAT: all3, Masquerade: true}},
		{"ClusterIP, other port: untouched", netfilter.IPv4,
			nftablestest.Packet{Src: podIP, Dst: ap("10.96.0.10:81")}, nftablestest.Verdict{}},
		{"ClusterIP, UDP to a TCP Service: untouched", netfilter.IPv4,
			nftablestest.Packet{Src: podIP, Dst: ap("10.96.0.10:80"), Proto: lb.UDP}, nftablestest.Verdict{}},
		{"IPv6 ClusterIP: the IPv6 endpoint", netfilter.IPv6,
			nftablestest.Packet{Src: ip("fd00:244::9"), Dst: ap("[fd00::10]:80")}, nftablestest.Verdict{DNAT: []nftablestest.Share{share("[fd00:244::1]:8080", 1, 1)}}},
		{"NodePort, Cluster policy: masqueraded", netfilter.IPv4,
			nftablestest.Packet{Src: hostIP, Dst: netip.AddrPortFrom(nodeIP, 30080), Local: true}, nftablestest.Verdict{DNAT: all3, Masquerade: true}},
		{"NodePort on loopback: untouched", netfilter.IPv4,
			nftablestest.Packet{Src: loopback, Dst: netip.AddrPortFrom(loopback, 30080), Local: true}, nftablestest.Verdict{}},
		{"NodePort port on a non-local address: untouched", netfilter.IPv4,
			nftablestest.Packet{Src: hostIP, Dst: ap("192.0.2.99:30080")}, nftablestest.Verdict{}},
		{"ExternalIP, Cluster policy: masqueraded", netfilter.IPv4,
			nftablestest.Packet{Src: hostIP, Dst: ap("203.0.113.10:80")}, nftablestest.Verdict{DNAT: all3, Masquerade: true}},
		{"ExternalIP, Local policy: the local endpoint, client kept", netfilter.IPv4,
			nftablestest.Packet{Src: hostIP, Dst: ap("203.0.113.20:80")}, nftablestest.Verdict{DNAT: []nftablestest.Share{share("10.244.1.3:8080", 1, 1)}}},
		{"NodePort, Local policy: the local endpoint, client kept", netfilter.IPv4,
			nftablestest.Packet{Src: hostIP, Dst: netip.AddrPortFrom(nodeIP2, 30081), Local: true}, nftablestest.Verdict{DNAT: []nftablestest.Share{share("10.244.1.3:8080", 1, 1)}}},
		{"ClusterIP of a Local-policy Service: every endpoint", netfilter.IPv4,
			nftablestest.Packet{Src: podIP, Dst: ap("10.96.0.20:80")}, nftablestest.Verdict{DNAT: []nftablestest.Share{share("10.244.1.3:8080", 1, 2), share("10.244.2.3:8080", 1, 2)}}},
		{"NodePort, Local policy, no local endpoint: rejected", netfilter.IPv4,
			nftablestest.Packet{Src: hostIP, Dst: netip.AddrPortFrom(nodeIP, 30082), Local: true}, nftablestest.Verdict{Reject: true}},
		// The short circuit: pods and the node get every endpoint.
		{"ExternalIP, Local policy, from a pod: every endpoint, client kept", netfilter.IPv4,
			nftablestest.Packet{Src: podIP, Dst: ap("203.0.113.20:80")}, nftablestest.Verdict{DNAT: []nftablestest.Share{share("10.244.1.3:8080", 1, 2), share("10.244.2.3:8080", 1, 2)}}},
		{"ExternalIP, Local policy, from the node: every endpoint, masqueraded", netfilter.IPv4,
			nftablestest.Packet{Src: nodeIP, Dst: ap("203.0.113.20:80"), LocalSource: true},
			nftablestest.Verdict{DNAT: []nftablestest.Share{share("10.244.1.3:8080", 1, 2), share("10.244.2.3:8080", 1, 2)}, Masquerade: true}},
		{"NodePort, Local policy, no local endpoint, from a pod: the other node's", netfilter.IPv4,
			nftablestest.Packet{Src: podIP, Dst: netip.AddrPortFrom(nodeIP, 30082), Local: true}, nftablestest.Verdict{DNAT: []nftablestest.Share{share("10.244.2.4:8080", 1, 1)}}},
		{"NodePort, Local policy, no local endpoint, from the node: masqueraded", netfilter.IPv4,
			nftablestest.Packet{Src: nodeIP, Dst: netip.AddrPortFrom(nodeIP, 30082), Local: true, LocalSource: true},
			nftablestest.Verdict{DNAT: []nftablestest.Share{share("10.244.2.4:8080", 1, 1)}, Masquerade: true}},
		{"its ClusterIP still serves", netfilter.IPv4,
			nftablestest.Packet{Src: podIP, Dst: ap("10.96.0.30:80")}, nftablestest.Verdict{DNAT: []nftablestest.Share{share("10.244.2.4:8080", 1, 1)}}},
		{"UDP ClusterIP without endpoints: rejected", netfilter.IPv4,
			nftablestest.Packet{Src: podIP, Dst: ap("10.96.0.40:53"), Proto: lb.UDP}, nftablestest.Verdict{Reject: true}},
		{"UDP NodePort without endpoints: rejected", netfilter.IPv4,
			nftablestest.Packet{Src: hostIP, Dst: netip.AddrPortFrom(nodeIP, 30053), Proto: lb.UDP, Local: true}, nftablestest.Verdict{Reject: true}},
		{"UDP ClusterIP", netfilter.IPv4,
			nftablestest.Packet{Src: podIP, Dst: ap("10.96.0.53:53"), Proto: lb.UDP}, nftablestest.Verdict{DNAT: []nftablestest.Share{share("10.244.1.53:8080", 1, 2), share("10.244.1.54:8080", 1, 2)}}},
		{"SCTP ClusterIP", netfilter.IPv4,
			nftablestest.Packet{Src: podIP, Dst: ap("10.96.0.60:9999"), Proto: lb.SCTP}, nftablestest.Verdict{DNAT: []nftablestest.Share{share("10.244.1.60:8080", 1, 1)}}},
		{"hairpin: an endpoint reaching itself", netfilter.IPv4,
			nftablestest.Packet{Src: ip("10.244.1.60"), Dst: ap("10.96.0.60:9999"), Proto: lb.SCTP},
			nftablestest.Verdict{DNAT: []nftablestest.Share{share("10.244.1.60:8080", 1, 1)}, Hairpin: []netip.AddrPort{ap("10.244.1.60:8080")}}},
		{"IPv4 ClusterIP in the IPv6 table: untouched", netfilter.IPv6,
			nftablestest.Packet{Src: podIP, Dst: ap("10.96.0.10:80")}, nftablestest.Verdict{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fake.Trace(tc.fam, tc.p); got.String() != tc.want.String() {
				t.Errorf("%v → %v: got %v, want %v", tc.p.Src, tc.p.Dst, got, tc.want)
			}
		})
	}
}

// TestNodePortAddresses: restricted NodePorts answer only on local
// addresses inside the prefixes; a family without a prefix has none.
func TestNodePortAddresses(t *testing.T) {
	m, fake, st := newMode(t, nftables.Config{IPv6: true, NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}})
	if err := m.Apply(context.Background(), snapshot(t, st, cluster()), true); err != nil {
		t.Fatal(err)
	}
	in := fake.Trace(netfilter.IPv4, nftablestest.Packet{Src: hostIP, Dst: netip.AddrPortFrom(nodeIP2, 30080), Local: true})
	out := fake.Trace(netfilter.IPv4, nftablestest.Packet{Src: hostIP, Dst: netip.AddrPortFrom(nodeIP, 30080), Local: true})
	if len(in.DNAT) == 0 || len(out.DNAT) != 0 {
		t.Errorf("inside the prefix: %v (want DNAT); outside: %v (want pass)", in, out)
	}
	if n := fake.Count(netfilter.IPv6, nftables.SetNodePortEndpoints); n != 0 {
		t.Errorf("IPv6 has no NodePort prefix, yet %d NodePort elements", n)
	}
}

// TestMasqueradeAll: kube-proxy's --masquerade-all, traffic sent to
// ClusterIPs masqueraded, from pods too; external traffic as without it:
// masqueraded under the Cluster policy, a Local policy's client kept, a pod
// short-circuited to the Cluster endpoints not masqueraded, the node
// masqueraded.
func TestMasqueradeAll(t *testing.T) {
	for _, tc := range []struct {
		name string
		cidr bool
		p    nftablestest.Packet
		masq bool
	}{
		{"ClusterIP from a pod", false, nftablestest.Packet{Src: podIP, Dst: ap("10.96.0.10:80")}, true},
		{"ClusterIP from a pod, a cluster CIDR set", true, nftablestest.Packet{Src: podIP, Dst: ap("10.96.0.10:80")}, true},
		{"Cluster policy ExternalIP from outside", false, nftablestest.Packet{Src: hostIP, Dst: ap("203.0.113.10:80")}, true},
		{"Cluster policy NodePort from outside", false, nftablestest.Packet{Src: hostIP, Dst: netip.AddrPortFrom(nodeIP, 30080), Local: true}, true},
		{"Local policy ExternalIP from outside", false, nftablestest.Packet{Src: hostIP, Dst: ap("203.0.113.20:80")}, false},
		{"Local policy NodePort from outside", false, nftablestest.Packet{Src: hostIP, Dst: netip.AddrPortFrom(nodeIP, 30081), Local: true}, false},
		{"Local policy ExternalIP from a pod, short-circuited", true, nftablestest.Packet{Src: podIP, Dst: ap("203.0.113.20:80")}, false},
		{"Local policy NodePort from a pod, short-circuited", true, nftablestest.Packet{Src: podIP, Dst: netip.AddrPortFrom(nodeIP, 30082), Local: true}, false},
		{"Local policy NodePort from the node, short-circuited", true, nftablestest.Packet{Src: nodeIP, Dst: netip.AddrPortFrom(nodeIP, 30082), Local: true, LocalSource: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := nftables.Config{MasqueradeAll: true}
			if tc.cidr {
				cfg.ClusterCIDRs = []netip.Prefix{podCIDR}
			}
			m, fake, st := newMode(t, cfg)
			if err := m.Apply(context.Background(), snapshot(t, st, cluster()), true); err != nil {
				t.Fatal(err)
			}
			if v := fake.Trace(netfilter.IPv4, tc.p); len(v.DNAT) == 0 || v.Masquerade != tc.masq {
				t.Errorf("%v -> %v: %+v, want DNAT, masquerade %v", tc.p.Src, tc.p.Dst, v, tc.masq)
			}
		})
	}
}

// TestIncremental: a change writes only the changed Service's elements, in
// one Update per family; no change writes nothing; adding a Service adds
// its elements alone; a removed UDP endpoint's flows are cleared.
func TestIncremental(t *testing.T) {
	ct := &conntracktest.Table{}
	flows := []conntrack.Flow{
		{Proto: lb.UDP, OrigSrc: ap("10.244.9.9:5353"), OrigDst: ap("10.96.0.53:53"), ReplySrc: ap("10.244.1.53:8080")},
		{Proto: lb.UDP, OrigSrc: ap("10.244.9.9:5354"), OrigDst: ap("10.96.0.53:53"), ReplySrc: ap("10.244.1.54:8080")},
		{Proto: lb.TCP, OrigSrc: ap("10.244.9.9:5355"), OrigDst: ap("10.96.0.53:53"), ReplySrc: ap("10.244.1.54:8080")},
	}
	ct.Add(netfilter.IPv4, flows...)
	m, fake, st := newMode(t, nftables.Config{Conntrack: ct})
	ctx := context.Background()
	svcs := cluster()
	if err := m.Apply(ctx, snapshot(t, st, svcs), true); err != nil {
		t.Fatal(err)
	}
	fake.ResetCalls()
	if err := m.Apply(ctx, snapshot(t, st, cluster()), false); err != nil {
		t.Fatal(err)
	}
	if c := fake.Calls(); len(c) != 0 {
		t.Errorf("no change wrote %v", c)
	}

	// One endpoint of the UDP Service goes: its second slot goes, its
	// slots-map element now names the 1-slot chain, its hairpin element
	// goes.
	svcs[4].Endpoints = svcs[4].Endpoints[:1]
	if err := m.Apply(ctx, snapshot(t, st, svcs), false); err != nil {
		t.Fatal(err)
	}
	if got, want := fake.Calls(), []string{"Update IPv4 -3 +1"}; !slices.Equal(got, want) {
		t.Errorf("an endpoint removed: calls %q, want %q", got, want)
	}
	if v := fake.Trace(netfilter.IPv4, nftablestest.Packet{Src: podIP, Dst: ap("10.96.0.53:53"), Proto: lb.UDP}); v.String() != (nftablestest.Verdict{DNAT: []nftablestest.Share{share("10.244.1.53:8080", 1, 1)}}).String() {
		t.Errorf("after the change: %v", v)
	}
	if got, want := ct.Flows(netfilter.IPv4), []conntrack.Flow{flows[0], flows[2]}; !slices.Equal(got, want) {
		t.Errorf("conntrack entries left %v, want all but the UDP flow to the removed endpoint: %v", got, want)
	}
	if n := m.ConntrackDeleted(netfilter.IPv4); n != 1 {
		t.Errorf("ConntrackDeleted(IPv4) = %d, want 1", n)
	}

	fake.ResetCalls()
	svcs = append(svcs, lb.Service{Name: name("new"), Port: 8080, ClusterIPs: []netip.Addr{ip("10.96.1.1")}, Endpoints: eps(nodeName, "10.244.1.99")})
	if err := m.Apply(ctx, snapshot(t, st, svcs), false); err != nil {
		t.Fatal(err)
	}
	if got, want := fake.Calls(), []string{"Update IPv4 -0 +3"}; !slices.Equal(got, want) { // a slot, the slots map's element, the hairpin
		t.Errorf("a Service added: calls %q, want %q", got, want)
	}
	fake.ResetCalls()
	if err := m.Apply(ctx, snapshot(t, st, svcs[:len(svcs)-1]), false); err != nil {
		t.Fatal(err)
	}
	if got, want := fake.Calls(), []string{"Update IPv4 -3 +0"}; !slices.Equal(got, want) {
		t.Errorf("a Service removed: calls %q, want %q", got, want)
	}
}

// TestSharedHairpin: two Services with the same endpoint share its hairpin
// element; removing one keeps it.
func TestSharedHairpin(t *testing.T) {
	m, fake, st := newMode(t, nftables.Config{})
	ctx := context.Background()
	a := lb.Service{Name: name("a"), Port: 80, ClusterIPs: []netip.Addr{ip("10.96.2.1")}, Endpoints: eps(nodeName, "10.244.3.1")}
	b := a
	b.Name, b.ClusterIPs = name("b"), []netip.Addr{ip("10.96.2.2")}
	if err := m.Apply(ctx, snapshot(t, st, []lb.Service{a, b}), true); err != nil {
		t.Fatal(err)
	}
	if err := m.Apply(ctx, snapshot(t, st, []lb.Service{b}), false); err != nil {
		t.Fatal(err)
	}
	v := fake.Trace(netfilter.IPv4, nftablestest.Packet{Src: ip("10.244.3.1"), Dst: ap("10.96.2.2:80")})
	if len(v.Hairpin) != 1 {
		t.Errorf("hairpin through b after a left: %v", v)
	}
}

// TestRepair: a full Apply finds elements removed or added behind its back,
// repairs them and counts a repair; a failed incremental write falls back
// to a full sync.
func TestRepair(t *testing.T) {
	m, fake, st := newMode(t, nftables.Config{FullSyncPeriod: -1})
	ctx := context.Background()
	svcs := cluster()
	snap := snapshot(t, st, svcs)
	if err := m.Apply(ctx, snap, true); err != nil {
		t.Fatal(err)
	}
	want := fake.Trace(netfilter.IPv4, nftablestest.Packet{Src: podIP, Dst: ap("10.96.0.10:80")})
	fake.Tamper(netfilter.IPv4, func(t nftables.Tables) {
		clear(t[nftables.SetServiceEndpoints])
		t[nftables.SetNoEndpoints][nftable.FrontendKey(ip("10.96.0.10"), lb.TCP, 80)] = ""
	})
	if v := fake.Trace(netfilter.IPv4, nftablestest.Packet{Src: podIP, Dst: ap("10.96.0.10:80")}); !v.Reject {
		t.Fatalf("tampering did not take: %v", v)
	}
	if err := m.Apply(ctx, snap, true); err != nil {
		t.Fatal(err)
	}
	if got := fake.Trace(netfilter.IPv4, nftablestest.Packet{Src: podIP, Dst: ap("10.96.0.10:80")}); got.String() != want.String() {
		t.Errorf("after the repair: %v, want %v", got, want)
	}
	if m.Repairs() != 1 {
		t.Errorf("Repairs() = %d, want 1", m.Repairs())
	}
	if err := m.Apply(ctx, snap, true); err != nil || m.Repairs() != 1 {
		t.Errorf("an intact table: err %v, Repairs() = %d, want 1", err, m.Repairs())
	}

	fake.Fail = errors.New("injected")
	svcs[0].Endpoints = svcs[0].Endpoints[:1]
	if err := m.Apply(ctx, snapshot(t, st, svcs), false); err != nil {
		t.Fatalf("a failed incremental write is not retried as a full sync: %v", err)
	}
	if got := m.RestoreFailures(netfilter.IPv4); got != 1 {
		t.Errorf("RestoreFailures = %d, want 1", got)
	}
	if v := fake.Trace(netfilter.IPv4, nftablestest.Packet{Src: podIP, Dst: ap("10.96.0.10:80")}); v.String() != (nftablestest.Verdict{DNAT: []nftablestest.Share{share("10.244.1.1:8080", 1, 1)}}).String() {
		t.Errorf("after the fallback: %v", v)
	}
}

// TestCleanup removes both families' tables.
func TestCleanup(t *testing.T) {
	m, fake, st := newMode(t, nftables.Config{IPv6: true})
	if err := m.Apply(context.Background(), snapshot(t, st, cluster()), true); err != nil {
		t.Fatal(err)
	}
	fake.ResetCalls()
	if err := m.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, want := fake.Calls(), []string{"Delete IPv4", "Delete IPv6"}; !slices.Equal(got, want) {
		t.Errorf("calls %q, want %q", got, want)
	}
	if v := fake.Trace(netfilter.IPv4, nftablestest.Packet{Src: podIP, Dst: ap("10.96.0.10:80")}); len(v.DNAT) != 0 {
		t.Errorf("after Cleanup: %v", v)
	}
}

// TestConfigErrors: bad configuration is refused with the field named.
func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  nftables.Config
		want string
	}{
		{nftables.Config{Mark: 0x80000}, "overlaps"},
		{nftables.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}, "clusterCIDRs[0]"},
		{nftables.Config{ClusterCIDRs: []netip.Prefix{podCIDR, netip.MustParsePrefix("10.0.0.0/8")}}, "more than one"},
	} {
		_, err := nftables.New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error with %q", tc.cfg, err, tc.want)
		}
	}
}

func ExampleFrontendKey() {
	fmt.Printf("% x\n", nftable.FrontendKey(netip.MustParseAddr("10.96.0.10"), lb.TCP, 80))
	// Output: 0a 60 00 0a 06 00 00 00 00 50 00 00
}

// BenchmarkApplyChange times the Go side of an endpoint change at 10,000
// Services (the Fake stands for the kernel).
func BenchmarkApplyChange(b *testing.B) {
	m, _, st := newMode(b, nftables.Config{})
	svcs := kerneltest.ScaleServices(10000)
	if err := m.Apply(context.Background(), snapshot(b, st, svcs), true); err != nil {
		b.Fatal(err)
	}
	snaps := make([]*lb.Snapshot, 2)
	for i := range snaps {
		svcs[7].Endpoints = slices.Clone(svcs[7].Endpoints)
		svcs[7].Endpoints[0].Addr = netip.AddrPortFrom(svcs[7].Endpoints[0].Addr.Addr(), uint16(9000+i))
		snaps[i] = snapshot(b, st, svcs)
	}
	b.ResetTimer()
	for i := range b.N {
		if err := m.Apply(context.Background(), snaps[i%2], false); err != nil {
			b.Fatal(err)
		}
	}
}

// TestAffinity: a Service with session affinity has its frontends and
// NodePort in its timeout's sets; a remembered client goes back to its
// endpoint; a client remembered with an endpoint that left, or by a
// Service that dropped affinity, picks afresh; timeouts coming and going
// change the layout without counting a repair.
func TestAffinity(t *testing.T) {
	m, fake, st := newMode(t, nftables.Config{})
	ctx := context.Background()
	sticky := lb.Service{Name: name("sticky"), Port: 80, ClusterIPs: []netip.Addr{ip("10.96.0.70")}, NodePort: 30090,
		AffinityTimeout: 59500 * time.Millisecond, Endpoints: eps(nodeName, "10.244.1.71", "10.244.1.72")}
	plain := lb.Service{Name: name("plain"), Port: 80, ClusterIPs: []netip.Addr{ip("10.96.0.80")}, Endpoints: eps(nodeName, "10.244.1.81")}
	apply := func(full bool, svcs ...lb.Service) {
		t.Helper()
		if err := m.Apply(ctx, snapshot(t, st, svcs), full); err != nil {
			t.Fatal(err)
		}
	}
	trace := func(dst netip.AddrPort, local bool) nftablestest.Verdict {
		return fake.Trace(netfilter.IPv4, nftablestest.Packet{Src: podIP, Dst: dst, Local: local})
	}
	apply(true, sticky, plain)
	vip, np := ap("10.96.0.70:80"), netip.AddrPortFrom(nodeIP, 30090)
	if v := trace(vip, false); v.Affinity != 60 || v.Remembered {
		t.Errorf("ClusterIP: %v, want affinity 60s, nothing remembered", v)
	}
	if v := trace(np, true); v.Affinity != 60 {
		t.Errorf("NodePort: %v, want affinity 60s", v)
	}
	if v := trace(ap("10.96.0.80:80"), false); v.Affinity != 0 {
		t.Errorf("a Service without affinity: %v", v)
	}

	fake.Remember(netfilter.IPv4, podIP, lb.TCP, vip, ap("10.244.1.71:8080"))
	fake.Remember(netfilter.IPv4, podIP, lb.TCP, np, ap("10.244.1.72:8080"))
	if v := trace(vip, false); !v.Remembered || v.DNAT[0].Endpoint != ap("10.244.1.71:8080") {
		t.Errorf("a remembered client: %v", v)
	}
	sticky.Endpoints = sticky.Endpoints[1:] // .71 leaves
	apply(false, sticky, plain)
	if v := trace(vip, false); v.Remembered {
		t.Errorf("remembered with an endpoint that left: %v", v)
	}
	if v := trace(np, true); !v.Remembered {
		t.Errorf("remembered with an endpoint that stayed: %v, want it kept", v)
	}

	other := plain
	other.AffinityTimeout = time.Hour
	apply(false, sticky, other) // a second timeout: the layout grows
	if v := trace(ap("10.96.0.80:80"), false); v.Affinity != 3600 {
		t.Errorf("a second timeout: %v", v)
	}
	sticky.AffinityTimeout = 0
	apply(false, sticky, plain) // no affinity left
	if v := trace(np, true); v.Remembered || v.Affinity != 0 {
		t.Errorf("after affinity was dropped: %v", v)
	}
	if n := fake.Count(netfilter.IPv4, nftables.AffinitySet(60)); n != 0 {
		t.Errorf("the 60s set still has %d elements", n)
	}
	if m.Repairs() != 0 {
		t.Errorf("layout changes counted %d repairs", m.Repairs())
	}
	apply(true, sticky, plain)
	if m.Repairs() != 0 {
		t.Errorf("a full Apply after layout changes counted %d repairs", m.Repairs())
	}
}

// discard is a Kernel that keeps nothing: the Go side of an Apply alone.
type discard struct{}

func (discard) Setup(context.Context, nftables.Layout, bool) (bool, error) { return true, nil }
func (discard) Elements(context.Context, netfilter.Family, string) (nftables.Elements, error) {
	return nftables.Elements{}, nil
}
func (discard) Update(context.Context, netfilter.Family, []nftables.Element, []nftables.Element) error {
	return nil
}
func (discard) Delete(context.Context, netfilter.Family) error { return nil }
func (discard) Probe(context.Context, netfilter.Family) error  { return nil }

// BenchmarkFirstLoad times the Go side of a first Apply at 10,000
// Services.
func BenchmarkFirstLoad(b *testing.B) {
	st := lb.NewStore(lb.StoreOptions{})
	snap := snapshot(b, st, kerneltest.ScaleServices(10000))
	b.ResetTimer()
	for range b.N {
		m, err := nftables.New(nftables.Config{Kernel: discard{}, Conntrack: &conntracktest.Table{}})
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Apply(context.Background(), snap, true); err != nil {
			b.Fatal(err)
		}
	}
}
