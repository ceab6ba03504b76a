package iptables

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/conntrack/conntracktest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
)

const nodeName = "node-a"

var (
	nodeIP     = netip.MustParseAddr("192.0.2.10")
	nodeIP2    = netip.MustParseAddr("198.51.100.10")
	nodeIP6    = netip.MustParseAddr("2001:db8::10")
	localAddrs = []netip.Addr{nodeIP, nodeIP2, nodeIP6}
	clientIP   = netip.MustParseAddrPort("10.244.1.5:40000")
	clientIP6  = netip.MustParseAddrPort("[fd00:244::5]:40000")
	podCIDR    = netip.MustParsePrefix("10.244.0.0/16")
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
func ip(s string) netip.Addr     { return netip.MustParseAddr(s) }

// eps returns n ready IPv4 endpoints 10.244.<net>.1.. on node (empty:
// another node), port 8080.
func eps(net byte, n int, node string) []lb.Endpoint {
	out := make([]lb.Endpoint, n)
	for i := range out {
		out[i] = lb.Endpoint{
			Addr:  netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, net, byte(i + 1)}), 8080),
			Ready: true, Serving: true, NodeName: node,
		}
	}
	return out
}

// eps6 returns n ready IPv6 endpoints fd00:244::<net>:1.. on node.
func eps6(net byte, n int, node string) []lb.Endpoint {
	out := make([]lb.Endpoint, n)
	for i := range out {
		out[i] = lb.Endpoint{
			Addr:  netip.MustParseAddrPort(fmt.Sprintf("[fd00:244::%x:%x]:8080", net, i+1)),
			Ready: true, Serving: true, NodeName: node,
		}
	}
	return out
}

func svcName(name string) lb.ServicePortName {
	return lb.ServicePortName{Namespace: "default", Name: name, Port: "p"}
}

// store returns a Store for node-a holding services.
func store(t testing.TB, services ...lb.Service) *lb.Store {
	t.Helper()
	s := lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: nodeName}})
	if _, err := s.Replace(services); err != nil {
		t.Fatalf("Replace: %v", err)
	}
	return s
}

// testServices is the example cluster most tests use: the redirect tests'
// table, plus Local policy with local endpoints and session affinity.
func testServices() []lb.Service {
	return []lb.Service{
		{ // TCP, every kind of frontend, endpoints of both families
			Name: svcName("web"), Port: 80,
			ClusterIPs:      []netip.Addr{ip("10.96.0.10"), ip("fd00::10")},
			ExternalIPs:     []netip.Addr{ip("203.0.113.10")},
			LoadBalancerIPs: []netip.Addr{ip("203.0.113.20")},
			NodePort:        30080,
			Endpoints:       slices.Concat(eps(1, 2, "node-b"), eps6(1, 2, "node-b")),
		},
		{ // externalTrafficPolicy Local with no local endpoint
			Name: svcName("local"), Port: 80,
			ClusterIPs:            []netip.Addr{ip("10.96.0.11")},
			LoadBalancerIPs:       []netip.Addr{ip("203.0.113.21")},
			NodePort:              30081,
			ExternalTrafficPolicy: lb.PolicyLocal,
			Endpoints:             eps(2, 1, "node-b"),
		},
		{ // UDP with endpoints
			Name: svcName("dns"), Protocol: lb.UDP, Port: 53,
			ClusterIPs: []netip.Addr{ip("10.96.0.53")},
			NodePort:   30053,
			Endpoints:  eps(3, 2, "node-b"),
		},
		{ // no endpoints
			Name: svcName("empty"), Port: 80,
			ClusterIPs: []netip.Addr{ip("10.96.0.12"), ip("fd00::12")},
			NodePort:   30082,
		},
		{
			Name: svcName("empty-udp"), Protocol: lb.UDP, Port: 53,
			ClusterIPs: []netip.Addr{ip("10.96.0.13")},
		},
		{ // externalTrafficPolicy Local with one local endpoint of three
			Name: svcName("local-ok"), Port: 443,
			ClusterIPs:            []netip.Addr{ip("10.96.0.14")},
			ExternalIPs:           []netip.Addr{ip("203.0.113.14")},
			NodePort:              30443,
			ExternalTrafficPolicy: lb.PolicyLocal,
			Endpoints:             slices.Concat(eps(4, 1, nodeName), eps(5, 2, "node-b")),
		},
		{ // session affinity
			Name: svcName("sticky"), Port: 80,
			ClusterIPs:      []netip.Addr{ip("10.96.0.15")},
			NodePort:        30015,
			AffinityTimeout: 30 * time.Second,
			Endpoints:       eps(6, 3, "node-b"),
		},
		{ // SCTP with endpoints: a ClusterIP and a NodePort
			Name: svcName("diameter"), Protocol: lb.SCTP, Port: 3868,
			ClusterIPs: []netip.Addr{ip("10.96.0.38")},
			NodePort:   30868,
			Endpoints:  eps(7, 2, "node-b"),
		},
		{ // SCTP without endpoints
			Name: svcName("empty-sctp"), Protocol: lb.SCTP, Port: 3868,
			ClusterIPs: []netip.Addr{ip("10.96.0.39")},
			NodePort:   30869,
		},
	}
}

// newFakeMode returns a Mode over a new Fake.
func newFakeMode(t testing.TB, cfg Config) (*Mode, *netfiltertest.Fake) {
	t.Helper()
	f := netfiltertest.NewFake()
	cfg.Exec = f
	if cfg.Conntrack == nil {
		cfg.Conntrack = &conntracktest.Table{}
	}
	if tt, ok := t.(*testing.T); ok && cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(tt)
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return m, f
}

func mustApply(t testing.TB, m *Mode, snap *lb.Snapshot, full bool) {
	t.Helper()
	if err := m.Apply(context.Background(), snap, full); err != nil {
		t.Fatalf("Apply(full=%v): %v", full, err)
	}
}

// pkt is a packet from a pod (PREROUTING) unless hook says otherwise.
func pkt(proto lb.Protocol, dst string, hook netfiltertest.Hook) netfiltertest.Packet {
	src := clientIP
	d := ap(dst)
	if hook == netfiltertest.Output {
		src = netip.AddrPortFrom(nodeIP, 40000)
	}
	if d.Addr().Is6() {
		src = clientIP6
		if hook == netfiltertest.Output {
			src = netip.AddrPortFrom(nodeIP6, 40000)
		}
	}
	return netfiltertest.Packet{Src: src, Dst: d, Proto: proto, Hook: hook, LocalAddrs: localAddrs}
}

func from(p netfiltertest.Packet, src string) netfiltertest.Packet {
	p.Src = ap(src)
	return p
}

// want is where a packet should go: spread evenly over eps (DNAT, with
// masquerade as said), or one fixed verdict (accepted, rejected).
type want struct {
	action netfiltertest.Action
	eps    []string
	masq   bool
}

var (
	accepted = want{action: netfiltertest.Accept}
	rejected = want{action: netfiltertest.Reject}
)

func spread(masq bool, eps ...string) want {
	return want{action: netfiltertest.DNAT, eps: eps, masq: masq}
}

func (w want) String() string {
	if w.action != netfiltertest.DNAT {
		return w.action.String()
	}
	s := "DNAT evenly to " + strings.Join(w.eps, ", ")
	if w.masq {
		s += " (masqueraded)"
	}
	return s
}

// traceDiff reports how the outcomes of p differ from w; "" when they match.
func traceDiff(f *netfiltertest.Fake, p netfiltertest.Packet, w want) string {
	got := f.TraceAll(p)
	show := func() string {
		var s []string
		for _, o := range got {
			s = append(s, fmt.Sprintf("%v p=%.4f (%s)", o.Verdict, o.Probability, o.Rule))
		}
		return strings.Join(s, "; ")
	}
	if w.action != netfiltertest.DNAT {
		if len(got) != 1 || got[0].Action != w.action || got[0].Masquerade {
			return fmt.Sprintf("got %s, want %v", show(), w)
		}
		return ""
	}
	if len(got) != len(w.eps) {
		return fmt.Sprintf("got %s, want %v", show(), w)
	}
	wantEps := slices.Clone(w.eps)
	slices.SortFunc(wantEps, func(a, b string) int { return ap(a).Compare(ap(b)) })
	for i, o := range got {
		if o.Action != netfiltertest.DNAT || o.Dst != ap(wantEps[i]) || o.Masquerade != w.masq ||
			math.Abs(o.Probability-1/float64(len(w.eps))) > 1e-6 {
			return fmt.Sprintf("got %s, want %v", show(), w)
		}
	}
	return ""
}

func checkTrace(t *testing.T, f *netfiltertest.Fake, p netfiltertest.Packet, w want) {
	t.Helper()
	if d := traceDiff(f, p, w); d != "" {
		t.Errorf("%v %v -> %v via %v: %s\n%s", p.Proto, p.Src, p.Dst, p.Hook, d, f.Dump())
	}
}

// desiredChains is every chain st needs in family fam, with its rules.
func (m *Mode) desiredChains(st *state, fam netfilter.Family) map[netfilter.ChainKey][]string {
	return m.ruleset(st).AllChains(fam)
}
