package nftables_test

import (
	"context"
	"net/netip"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/internal/kerneltest"
	"github.com/svcproxy/svcproxy/internal/topology"
	"github.com/svcproxy/svcproxy/kernelmodes/nftables"
	"github.com/svcproxy/svcproxy/lb"
)

// TestPrivilegedUnservedFlows: a client's SYN and datagram reach Service
// IPs before their Services exist (a node starting, a Service used as soon
// as it is created) and go nowhere; conntrack keeps both entries, not
// NATed. Once the Services exist, the same client ports must reach the
// backend, not follow the old entries (topology.SamePorts).
func TestPrivilegedUnservedFlows(t *testing.T) {
	privileged.Require(t)
	ctx := context.Background()
	top := topology.NewT(t, topology.Options{Backends: 1, Clients: 1})
	kerneltest.Run(t, "ip", "-n", top.Node.NS, "route", "add", topology.FreeRange.String(), "dev", "lo")
	b0 := top.Backends[0]
	topology.ServeNames(t, b0)
	web, dns := netip.MustParseAddrPort("198.19.0.30:80"), netip.MustParseAddrPort("198.19.0.31:53")
	ep := []lb.Endpoint{{Addr: netip.AddrPortFrom(b0.Addr, 8080), Ready: true, Serving: true, NodeName: nodeName}}
	services := []lb.Service{{Name: name("other"), Port: 80, Endpoints: ep, ClusterIPs: []netip.Addr{netip.MustParseAddr("198.19.0.39")}}}
	st := lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: nodeName}})
	m, err := nftables.New(nftables.Config{NetNS: top.Node.NS, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Apply(ctx, snapshot(t, st, services), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Cleanup(ctx) })
	topology.SamePorts(t, top.Clients[0], web, dns, b0.Name, func() {
		services = append(services,
			lb.Service{Name: name("web"), Port: 80, Endpoints: ep, ClusterIPs: []netip.Addr{web.Addr()}},
			lb.Service{Name: name("dns"), Protocol: lb.UDP, Port: 53, Endpoints: ep, ClusterIPs: []netip.Addr{dns.Addr()}})
		if err := m.Apply(ctx, snapshot(t, st, services), false); err != nil {
			t.Fatal(err)
		}
	})
	if got := m.UnservedCleared(); got != 2 {
		t.Errorf("UnservedCleared = %d, want 2 (the SYN's entry and the datagram's)", got)
	}
}
