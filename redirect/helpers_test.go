package redirect

import (
	"context"
	"net/netip"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/conntrack/conntracktest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
	"github.com/svcproxy/svcproxy/redirect/steertable/steertabletest"
)

const (
	testMark    = 0x80000
	testTCPPort = 15001
	nodeName    = "node-a"
)

var (
	nodeIP     = netip.MustParseAddr("192.0.2.10")
	nodeIP2    = netip.MustParseAddr("198.51.100.10")
	nodeIP6    = netip.MustParseAddr("2001:db8::10")
	localAddrs = []netip.Addr{nodeIP, nodeIP2, nodeIP6}
	clientIP   = netip.MustParseAddrPort("10.244.1.5:40000")
	outsideIP  = netip.MustParseAddrPort("203.0.113.7:40000") // a client outside the cluster
	outsideIP6 = netip.MustParseAddrPort("[2001:db8::7]:40000")
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
func ip(s string) netip.Addr     { return netip.MustParseAddr(s) }

// eps returns n ready endpoints on node (empty: another node).
func eps(n int, node string) []lb.Endpoint {
	out := make([]lb.Endpoint, n)
	for i := range out {
		out[i] = lb.Endpoint{
			Addr:     netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i + 1)}), 8080),
			Ready:    true,
			Serving:  true,
			NodeName: node,
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

// testServices is the example cluster most tests use.
func testServices() []lb.Service {
	return []lb.Service{
		{ // TCP, every kind of frontend, endpoints
			Name: svcName("web"), Port: 80,
			ClusterIPs:      []netip.Addr{ip("10.96.0.10"), ip("fd00::10")},
			ExternalIPs:     []netip.Addr{ip("203.0.113.10")},
			LoadBalancerIPs: []netip.Addr{ip("203.0.113.20")},
			NodePort:        30080,
			Endpoints:       eps(2, "node-b"),
		},
		{ // externalTrafficPolicy Local with no local endpoint
			Name: svcName("local"), Port: 80,
			ClusterIPs:            []netip.Addr{ip("10.96.0.11")},
			LoadBalancerIPs:       []netip.Addr{ip("203.0.113.21")},
			NodePort:              30081,
			ExternalTrafficPolicy: lb.PolicyLocal,
			Endpoints:             eps(1, "node-b"),
		},
		{ // UDP with endpoints
			Name: svcName("dns"), Protocol: lb.UDP, Port: 53,
			ClusterIPs: []netip.Addr{ip("10.96.0.53")},
			NodePort:   30053,
			Endpoints:  eps(2, "node-b"),
		},
		{ // no endpoints
			Name: svcName("empty"), Port: 80,
			ClusterIPs: []netip.Addr{ip("10.96.0.12")},
			NodePort:   30082,
		},
		{
			Name: svcName("empty-udp"), Protocol: lb.UDP, Port: 53,
			ClusterIPs: []netip.Addr{ip("10.96.0.13")},
		},
	}
}

func testPorts() Ports {
	return Ports{TCP: testTCPPort, UDP: map[lb.Frontend]uint16{
		{Protocol: lb.UDP, Addr: ap("10.96.0.53:53")}:  40053,
		{Protocol: lb.UDP, Addr: ap("0.0.0.0:30053")}:  40054,
		{Protocol: lb.UDP, Addr: ap("[::]:30053")}:     40055,
		{Protocol: lb.UDP, Addr: ap("10.96.0.13:53")}:  40056,
		{Protocol: lb.UDP, Addr: ap("10.96.0.99:53")}:  40057, // no such Service: ignored
		{Protocol: lb.TCP, Addr: ap("10.96.0.10:80")}:  1,     // TCP: ignored
		{Protocol: lb.UDP, Addr: ap("[fd00::53]:53")}:  40058,
		{Protocol: lb.UDP, Addr: ap("[fd00::99]:530")}: 40059,
	}}
}

// newFakeRedirector returns a Redirector of the iptables backend over a new
// netfiltertest.Fake (and a steertabletest.Fake, which it only cleans).
func newFakeRedirector(t testing.TB, cfg Config) (*Redirector, *netfiltertest.Fake) {
	t.Helper()
	f := netfiltertest.NewFake()
	cfg.Exec = f
	if cfg.Backend == "" {
		cfg.Backend = BackendIPTables
	}
	if cfg.NFT == nil {
		cfg.NFT = steertabletest.NewFake()
	}
	return newRedirector(t, cfg), f
}

// newFakeNFTRedirector returns a Redirector of the nftables backend over a
// new steertabletest.Fake (and a netfiltertest.Fake for the iptables tools).
func newFakeNFTRedirector(t testing.TB, cfg Config) (*Redirector, *steertabletest.Fake, *netfiltertest.Fake) {
	t.Helper()
	k, f := steertabletest.NewFake(), netfiltertest.NewFake()
	cfg.Backend, cfg.NFT, cfg.Exec = BackendNFTables, k, f
	return newRedirector(t, cfg), k, f
}

// tracer is either fake: where does a packet go.
type tracer interface {
	Trace(netfiltertest.Packet) netfiltertest.Verdict
	Dump() string
}

// fakeBackends run the behavioural tables over both backends' fakes.
var fakeBackends = []struct {
	name string
	new  func(t testing.TB, cfg Config) (*Redirector, tracer)
}{
	{"iptables", func(t testing.TB, cfg Config) (*Redirector, tracer) { return newFakeRedirector(t, cfg) }},
	{"nftables", func(t testing.TB, cfg Config) (*Redirector, tracer) {
		r, k, _ := newFakeNFTRedirector(t, cfg)
		return r, k
	}},
}

func newRedirector(t testing.TB, cfg Config) *Redirector {
	t.Helper()
	if cfg.Mark == 0 {
		cfg.Mark = testMark
	}
	if cfg.Conntrack == nil && cfg.NetNS == "" { // never this process's namespace's entries
		cfg.Conntrack = &conntracktest.Table{}
	}
	if tt, ok := t.(*testing.T); ok && cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(tt)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return r
}

func mustApply(t testing.TB, r *Redirector, snap *lb.Snapshot, ports Ports, full bool) {
	t.Helper()
	if err := r.Apply(context.Background(), snap, ports, full); err != nil {
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
		src = ap("[fd00:244::5]:40000")
		if hook == netfiltertest.Output {
			src = netip.AddrPortFrom(nodeIP6, 40000)
		}
	}
	return netfiltertest.Packet{Src: src, Dst: d, Proto: proto, Hook: hook, LocalAddrs: localAddrs}
}

// clusterCIDRs hold the pod clients pkt sends from (clientIP in IPv4).
var clusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/48")}

// from is p sent from src.
func from(src netip.AddrPort, p netfiltertest.Packet) netfiltertest.Packet {
	p.Src = src
	return p
}

func redirected(port uint16) netfiltertest.Verdict {
	return netfiltertest.Verdict{Action: netfiltertest.Redirect, Port: port}
}

var (
	accepted = netfiltertest.Verdict{Action: netfiltertest.Accept}
	rejected = netfiltertest.Verdict{Action: netfiltertest.Reject}
	dropped  = netfiltertest.Verdict{Action: netfiltertest.Drop}
)

// checkTrace fails when f sends p anywhere but want (the Rule is ignored).
// A DNAT's destination counts; an unchanged one (Dst zero) as well.
func checkTrace(t *testing.T, f tracer, p netfiltertest.Packet, want netfiltertest.Verdict) {
	t.Helper()
	got := f.Trace(p)
	if got.Action != want.Action || got.Port != want.Port || got.Dst != want.Dst {
		t.Errorf("Trace(%v %v via %v, mark %#x) = %v (rule %q), want %v\n%s",
			p.Proto, p.Dst, hookName(p.Hook), p.Mark, got, got.Rule, want, f.Dump())
	}
}

func hookName(h netfiltertest.Hook) string {
	if h == netfiltertest.Output {
		return "OUTPUT"
	}
	return "PREROUTING"
}
