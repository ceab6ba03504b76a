package kerneltest

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/svcproxy/svcproxy/lb"
)

// Input hands out fuzz input; past the end it returns zeros.
type Input struct {
	b []byte
	i int
}

// NewInput reads b.
func NewInput(b []byte) *Input { return &Input{b: b} }

// Next returns the next byte.
func (r *Input) Next() byte {
	if r.i >= len(r.b) {
		return 0
	}
	r.i++
	return r.b[r.i-1]
}

// Pick returns the next byte modulo n.
func (r *Input) Pick(n int) int { return int(r.Next()) % n }

// Small pools, so Services collide on frontends, NodePorts and node
// addresses.
var (
	fuzzVIPs = []netip.Addr{
		netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("10.96.0.2"),
		netip.MustParseAddr("fd00::1"), netip.MustParseAddr("203.0.113.1"),
	}
	fuzzPorts     = []uint16{53, 80}
	fuzzNodePorts = []uint16{0, 30000, 30001, 80}
	fuzzPrefixes  = [][]netip.Prefix{
		nil,
		{netip.MustParsePrefix("192.0.2.0/24")},
		{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("2001:db8::/64")},
		{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")},
	}
)

// NodePortAddresses picks one of four --nodeport-addresses lists: none, a
// node's /24, everything IPv4 plus an IPv6 /64, loopback only.
func (r *Input) NodePortAddresses() []netip.Prefix {
	return fuzzPrefixes[r.Pick(len(fuzzPrefixes))]
}

// ServiceOptions says how Input.Services draws Services.
type ServiceOptions struct {
	// Node is this node's name: an endpoint is on it or on "node-b".
	Node string
	// NodeIPs join the pool of VIPs, as ExternalIPs that are node
	// addresses.
	NodeIPs []netip.Addr
	// Affinity gives one Service in four session affinity (1 to 100 s).
	Affinity bool
	// MaxEndpoints is the most endpoints a Service has.
	MaxEndpoints int
	// Endpoints, if set, is the pool endpoint addresses are drawn from
	// (shared between Services); nil: every Service's own, 10.244.<its
	// index>.<1..>:8080.
	Endpoints []netip.AddrPort
}

// Services decodes up to six Services (protocols TCP, UDP and SCTP; both
// traffic policies; up to two ClusterIPs, an ExternalIP and a
// LoadBalancer IP), drawn from small pools so they collide.
func (r *Input) Services(o ServiceOptions) []lb.Service {
	vips := slices.Concat(fuzzVIPs, o.NodeIPs)
	n := r.Pick(7)
	out := make([]lb.Service, 0, n)
	for i := range n {
		svc := lb.Service{
			Name:                  lb.ServicePortName{Namespace: "ns", Name: fmt.Sprintf("s%d", r.Pick(8))},
			Protocol:              lb.Protocol(r.Pick(3)), // TCP, UDP or SCTP
			Port:                  fuzzPorts[r.Pick(len(fuzzPorts))],
			NodePort:              fuzzNodePorts[r.Pick(len(fuzzNodePorts))],
			ExternalTrafficPolicy: lb.TrafficPolicy(r.Pick(2)),
			InternalTrafficPolicy: lb.TrafficPolicy(r.Pick(2)),
		}
		if o.Affinity && r.Pick(4) == 0 {
			svc.AffinityTimeout = time.Duration(1+r.Pick(100)) * time.Second
		}
		for range r.Pick(3) {
			svc.ClusterIPs = append(svc.ClusterIPs, vips[r.Pick(len(vips))])
		}
		for range r.Pick(2) {
			svc.ExternalIPs = append(svc.ExternalIPs, vips[r.Pick(len(vips))])
		}
		for range r.Pick(2) {
			svc.LoadBalancerIPs = append(svc.LoadBalancerIPs, vips[r.Pick(len(vips))])
		}
		for j := range r.Pick(o.MaxEndpoints + 1) {
			flags := r.Next()
			node := "node-b"
			if flags&1 != 0 {
				node = o.Node
			}
			addr := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), byte(j + 1)}), 8080)
			if o.Endpoints != nil {
				addr = o.Endpoints[r.Pick(len(o.Endpoints))]
			}
			svc.Endpoints = append(svc.Endpoints, lb.Endpoint{
				Addr:     addr,
				Ready:    flags&2 != 0,
				Serving:  flags&4 != 0,
				NodeName: node,
			})
		}
		out = append(out, svc)
	}
	return out
}

// Destinations are the addresses worth tracing for services: every
// frontend, every NodePort on nodeIPs, loopback and an address that is
// not the node's, and two addresses no Service has; sorted.
func Destinations(services []lb.Service, nodeIPs ...netip.Addr) []netip.AddrPort {
	dsts := []netip.AddrPort{netip.MustParseAddrPort("8.8.8.8:53"), netip.MustParseAddrPort("[2001:4860::8888]:80")}
	others := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1"), netip.MustParseAddr("192.0.2.99")}
	for _, s := range services {
		for _, a := range slices.Concat(s.ClusterIPs, s.ExternalIPs, s.LoadBalancerIPs) {
			dsts = append(dsts, netip.AddrPortFrom(a, s.Port))
		}
		if s.NodePort != 0 {
			for _, a := range slices.Concat(nodeIPs, others) {
				dsts = append(dsts, netip.AddrPortFrom(a, s.NodePort))
			}
		}
	}
	slices.SortFunc(dsts, netip.AddrPort.Compare)
	return slices.Compact(dsts)
}
