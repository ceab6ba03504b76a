package redirect

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/svcproxy/svcproxy/conntrack/conntracktest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
	"github.com/svcproxy/svcproxy/redirect/steertable/steertabletest"
)

// TestShortCircuitSteering: an externalTrafficPolicy Local Service whose
// endpoints all run on other nodes is served to clients inside the cluster
// (its short circuit, as kube-proxy's): a pod within Config.ClusterCIDRs or
// the node itself is steered to the forwarder at its LoadBalancer IP,
// ExternalIP and NodePort, TCP and UDP, in both families; anyone else is
// refused there by the kernel, as at a frontend without endpoints, and
// never reaches the forwarder. Its ClusterIP serves everyone.
func TestShortCircuitSteering(t *testing.T) {
	services, ports := shortServices(), shortPorts()
	pod6 := ap("[fd00:244::5]:40000")
	type tc struct {
		name string
		p    netfiltertest.Packet
		want netfiltertest.Verdict
	}
	inside := func(cidrs bool) []tc {
		podWant := func(v netfiltertest.Verdict) netfiltertest.Verdict {
			if !cidrs {
				return rejected // without --cluster-cidr a pod is like any outside client
			}
			return v
		}
		return []tc{
			{"pod to the LB IP", pkt(lb.TCP, "203.0.113.41:443", netfiltertest.Prerouting), podWant(redirected(testTCPPort))},
			{"pod to the ExternalIP", pkt(lb.TCP, "203.0.113.40:443", netfiltertest.Prerouting), podWant(redirected(testTCPPort))},
			{"pod to the IPv6 LB IP", from(pod6, pkt(lb.TCP, "[2001:db8:1::41]:443", netfiltertest.Prerouting)), podWant(redirected(testTCPPort))},
			{"pod to the NodePort", pkt(lb.TCP, "192.0.2.10:30443", netfiltertest.Prerouting), podWant(redirected(testTCPPort))},
			{"pod to the IPv6 NodePort", from(pod6, pkt(lb.TCP, "[2001:db8::10]:30443", netfiltertest.Prerouting)), podWant(redirected(testTCPPort))},
			{"pod to the UDP LB IP", pkt(lb.UDP, "203.0.113.42:443", netfiltertest.Prerouting), podWant(redirected(41002))},
			{"pod to the UDP NodePort", pkt(lb.UDP, "198.51.100.10:30444", netfiltertest.Prerouting), podWant(redirected(41003))},
			{"pod to the IPv6 UDP NodePort", from(pod6, pkt(lb.UDP, "[2001:db8::10]:30444", netfiltertest.Prerouting)), podWant(redirected(41004))},
			{"node to the LB IP", pkt(lb.TCP, "203.0.113.41:443", netfiltertest.Output), redirected(testTCPPort)},
			{"node to the IPv6 LB IP", pkt(lb.TCP, "[2001:db8:1::41]:443", netfiltertest.Output), redirected(testTCPPort)},
			{"node to the NodePort on loopback", pkt(lb.TCP, "127.0.0.1:30443", netfiltertest.Output), redirected(testTCPPort)},
			{"node to the UDP LB IP", pkt(lb.UDP, "203.0.113.42:443", netfiltertest.Output), redirected(41002)},
			{"node to the UDP NodePort", pkt(lb.UDP, "192.0.2.10:30444", netfiltertest.Output), redirected(41003)},
			{"outside to the LB IP", from(outsideIP, pkt(lb.TCP, "203.0.113.41:443", netfiltertest.Prerouting)), rejected},
			{"outside to the ExternalIP", from(outsideIP, pkt(lb.TCP, "203.0.113.40:443", netfiltertest.Prerouting)), rejected},
			{"outside to the IPv6 LB IP", from(outsideIP6, pkt(lb.TCP, "[2001:db8:1::41]:443", netfiltertest.Prerouting)), rejected},
			{"outside to the NodePort", from(outsideIP, pkt(lb.TCP, "192.0.2.10:30443", netfiltertest.Prerouting)), rejected},
			{"outside to the IPv6 NodePort", from(outsideIP6, pkt(lb.TCP, "[2001:db8::10]:30443", netfiltertest.Prerouting)), rejected},
			{"outside to the UDP LB IP", from(outsideIP, pkt(lb.UDP, "203.0.113.42:443", netfiltertest.Prerouting)), rejected},
			{"outside to the UDP NodePort", from(outsideIP, pkt(lb.UDP, "192.0.2.10:30444", netfiltertest.Prerouting)), rejected},
			{"outside straight to the UDP LB IP's socket", from(outsideIP, pkt(lb.UDP, "192.0.2.10:41002", netfiltertest.Prerouting)), dropped},
			{"outside to the ClusterIP", from(outsideIP, pkt(lb.TCP, "10.96.1.1:443", netfiltertest.Prerouting)), redirected(testTCPPort)},
			{"outside to the UDP ClusterIP", from(outsideIP, pkt(lb.UDP, "10.96.1.2:443", netfiltertest.Prerouting)), redirected(41001)},
			{"forwarder's own dial to the LB IP", func() netfiltertest.Packet {
				p := pkt(lb.TCP, "203.0.113.41:443", netfiltertest.Output)
				p.Mark = testMark
				return p
			}(), accepted},
		}
	}
	for _, b := range fakeBackends {
		for _, cidrs := range []bool{true, false} {
			for _, nodeIPs := range [][]netip.Addr{nil, {nodeIP, nodeIP6}} {
				name := b.name + "/cluster CIDRs"
				if !cidrs {
					name = b.name + "/no cluster CIDR"
				}
				if nodeIPs != nil {
					name += "/dnat"
				}
				t.Run(name, func(t *testing.T) {
					cfg := Config{IPv6: true, NodeIPs: nodeIPs}
					if cidrs {
						cfg.ClusterCIDRs = clusterCIDRs
					}
					r, f := b.new(t, cfg)
					st := store(t, services...)
					mustApply(t, r, st.Snapshot(), ports, true)
					for _, c := range inside(cidrs) {
						t.Run(c.name, func(t *testing.T) { checkTrace(t, f, c.p, steeredVia(nodeIPs, c.p, c.want)) })
					}
					// An endpoint arrives here: everyone is served; it goes
					// again: back to the short circuit (incremental Applies).
					here := slices.Clone(services)
					local := lb.Endpoint{Addr: ap("10.244.9.9:8080"), Ready: true, Serving: true, NodeName: nodeName}
					here[0].Endpoints = append([]lb.Endpoint{local}, services[0].Endpoints...)
					outside := from(outsideIP, pkt(lb.TCP, "203.0.113.41:443", netfiltertest.Prerouting))
					node := pkt(lb.TCP, "203.0.113.41:443", netfiltertest.Output)
					for _, step := range []struct {
						services []lb.Service
						want     netfiltertest.Verdict
					}{{here, redirected(testTCPPort)}, {services, rejected}} {
						snap, err := st.Replace(step.services)
						if err != nil {
							t.Fatalf("Replace: %v", err)
						}
						mustApply(t, r, snap, ports, false)
						checkTrace(t, f, outside, steeredVia(nodeIPs, outside, step.want))
						checkTrace(t, f, node, steeredVia(nodeIPs, node, redirected(testTCPPort)))
					}
				})
			}
		}
	}
}

// TestShortCircuitEveryone: a cluster CIDR of /0 makes every client
// inside (ipset's hash:net cannot hold a /0: it is written as two /1s).
func TestShortCircuitEveryone(t *testing.T) {
	svc := lb.Service{
		Name: svcName("ingress"), Port: 443,
		ClusterIPs:            []netip.Addr{ip("10.96.1.1")},
		LoadBalancerIPs:       []netip.Addr{ip("203.0.113.41"), ip("2001:db8:1::41")},
		ExternalTrafficPolicy: lb.PolicyLocal,
		Endpoints:             eps(1, "node-b"),
	}
	for _, b := range fakeBackends {
		t.Run(b.name, func(t *testing.T) {
			r, f := b.new(t, Config{IPv6: true, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}})
			mustApply(t, r, store(t, svc).Snapshot(), Ports{TCP: testTCPPort}, true)
			for _, p := range []netfiltertest.Packet{
				from(outsideIP, pkt(lb.TCP, "203.0.113.41:443", netfiltertest.Prerouting)),
				from(ap("100.64.0.1:1234"), pkt(lb.TCP, "203.0.113.41:443", netfiltertest.Prerouting)), // 0.0.0.0/1
				from(outsideIP6, pkt(lb.TCP, "[2001:db8:1::41]:443", netfiltertest.Prerouting)),
				from(ap("[fe80::1]:1234"), pkt(lb.TCP, "[2001:db8:1::41]:443", netfiltertest.Prerouting)),
			} {
				checkTrace(t, f, p, redirected(testTCPPort))
			}
		})
	}
}

// shortServices are TestShortCircuitSteering's: a TCP and a UDP Service
// with externalTrafficPolicy Local and every endpoint on another node.
func shortServices() []lb.Service {
	return []lb.Service{
		{
			Name: svcName("ingress"), Port: 443,
			ClusterIPs:            []netip.Addr{ip("10.96.1.1"), ip("fd00::1:1")},
			ExternalIPs:           []netip.Addr{ip("203.0.113.40")},
			LoadBalancerIPs:       []netip.Addr{ip("203.0.113.41"), ip("2001:db8:1::41")},
			NodePort:              30443,
			ExternalTrafficPolicy: lb.PolicyLocal,
			Endpoints:             eps(2, "node-b"),
		},
		{
			Name: svcName("quic"), Protocol: lb.UDP, Port: 443,
			ClusterIPs:            []netip.Addr{ip("10.96.1.2")},
			LoadBalancerIPs:       []netip.Addr{ip("203.0.113.42")},
			NodePort:              30444,
			ExternalTrafficPolicy: lb.PolicyLocal,
			Endpoints:             eps(2, "node-b"),
		},
	}
}

// shortPorts are the forwarder's ports for shortServices.
func shortPorts() Ports {
	return Ports{TCP: testTCPPort, UDP: map[lb.Frontend]uint16{
		{Protocol: lb.UDP, Addr: ap("10.96.1.2:443")}:    41001,
		{Protocol: lb.UDP, Addr: ap("203.0.113.42:443")}: 41002,
		{Protocol: lb.UDP, Addr: ap("0.0.0.0:30444")}:    41003,
		{Protocol: lb.UDP, Addr: ap("[::]:30444")}:       41004,
	}}
}

// TestShortCircuitSteeredUDP: the UDP frontends and NodePorts served by
// their short circuit keep their forwarder ports across a restart, as the
// others do: a new Redirector reads them back (SteeredUDP).
func TestShortCircuitSteeredUDP(t *testing.T) {
	want := map[lb.Frontend]uint16{}
	for fe, p := range shortPorts().UDP {
		want[fe] = p
	}
	for _, b := range []Backend{BackendIPTables, BackendNFTables} {
		t.Run(string(b), func(t *testing.T) {
			f, k := netfiltertest.NewFake(), steertabletest.NewFake()
			cfg := Config{Backend: b, Mark: testMark, IPv6: true, ClusterCIDRs: clusterCIDRs, Exec: f, NFT: k, Conntrack: &conntracktest.Table{}}
			r, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			mustApply(t, r, store(t, shortServices()...).Snapshot(), shortPorts(), true)
			next, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			got, err := next.SteeredUDP(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, want) {
				t.Errorf("SteeredUDP = %v, want %v", got, want)
			}
		})
	}
}
