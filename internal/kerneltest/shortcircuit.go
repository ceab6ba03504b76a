package kerneltest

import (
	"net/netip"
	"testing"

	"github.com/svcproxy/svcproxy/internal/topology"
	"github.com/svcproxy/svcproxy/lb"
)

// ShortCircuit sends real connections through a kernel mode's short
// circuit of externalTrafficPolicy Local (lb.Balancer.ShortCircuit), the
// same cases for every mode that has one. In a topology of two backends
// (backend0 on node, backend1 on another node) and two clients, start must
// program the node namespace with services for node, the first client's
// address as its cluster CIDR. Then the first client (a pod) and the node
// reach every endpoint at the external frontends and NodePorts, the pod
// with its address kept and the node masqueraded; the second client
// (outside the cluster) reaches backend0 alone, with its address kept,
// and is refused by a Service whose endpoints are all elsewhere.
func ShortCircuit(t *testing.T, node string, start func(n *topology.Host, cidr netip.Prefix, services []lb.Service)) {
	t.Helper()
	top := topology.NewT(t, topology.Options{Backends: 2, Clients: 2})
	Run(t, "ip", "-n", top.Node.NS, "route", "add", topology.FreeRange.String(), "dev", "lo")
	for _, b := range top.Backends {
		topology.ServeNames(t, b)
	}
	pod, outside := top.Clients[0], top.Clients[1]
	ep := func(h *topology.Host, on string) lb.Endpoint {
		return lb.Endpoint{Addr: netip.AddrPortFrom(h.Addr, 8080), Ready: true, Serving: true, NodeName: on}
	}
	vip := func(last byte) netip.Addr { return netip.AddrFrom4([4]byte{198, 19, 0, last}) }
	name := func(n string) lb.ServicePortName { return lb.ServicePortName{Namespace: "default", Name: n, Port: "p"} }
	start(top.Node, netip.PrefixFrom(pod.Addr, 32), []lb.Service{
		{Name: name("local"), Port: 80, NodePort: 30081, ExternalTrafficPolicy: lb.PolicyLocal,
			Endpoints:  []lb.Endpoint{ep(top.Backends[0], node), ep(top.Backends[1], "elsewhere")},
			ClusterIPs: []netip.Addr{vip(11)}, ExternalIPs: []netip.Addr{vip(101)}},
		{Name: name("elsewhere"), Port: 80, NodePort: 30083, ExternalTrafficPolicy: lb.PolicyLocal,
			Endpoints:  []lb.Endpoint{ep(top.Backends[1], "elsewhere")},
			ClusterIPs: []netip.Addr{vip(13)}, LoadBalancerIPs: []netip.Addr{vip(103)}},
	})
	nodeAddr := topology.NodeAddr.String()
	both, there := []string{"backend0", "backend1"}, []string{"backend1"}
	for _, tc := range []struct {
		from     *topology.Host
		dst      string
		backends []string
	}{
		{pod, nodeAddr + ":30081", both},
		{pod, "198.19.0.101:80", both},
		{pod, nodeAddr + ":30083", there},
		{pod, "198.19.0.103:80", there},
		{top.Node, nodeAddr + ":30081", both},
		{top.Node, "198.19.0.101:80", both},
		{top.Node, "198.19.0.103:80", there},
		{outside, nodeAddr + ":30081", []string{"backend0"}},
		{outside, "198.19.0.101:80", []string{"backend0"}},
	} {
		t.Run(tc.from.Name+" to "+tc.dst, func(t *testing.T) {
			topology.Spread(t, tc.from, "tcp4", tc.dst, tc.backends, func(string) string {
				if tc.from == top.Node {
					return nodeAddr // masqueraded to its address toward the backends
				}
				return tc.from.Addr.String() // kept
			})
		})
	}
	for _, dst := range []string{nodeAddr + ":30083", "198.19.0.103:80"} {
		t.Run(outside.Name+" to "+dst+": refused", func(t *testing.T) { topology.Refused(t, outside, "tcp4", dst) })
	}
}
