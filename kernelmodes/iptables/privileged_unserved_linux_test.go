package iptables

import (
	"context"
	"net/netip"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/internal/kerneltest"
	"github.com/svcproxy/svcproxy/internal/topology"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// TestPrivilegedUnservedFlows is the nftables mode's test of the same
// name for each iptables variant: a SYN and a datagram to Service IPs
// before their Services exist, then the same client ports once they do
// must reach the backend.
func TestPrivilegedUnservedFlows(t *testing.T) {
	privileged.Require(t)
	for _, variant := range kerneltest.Variants() {
		t.Run(kerneltest.VariantName(variant), func(t *testing.T) {
			ctx := context.Background()
			top := serviceTopology(t)
			b0 := top.Backends[0]
			topology.ServeNames(t, b0)
			web, dns := netip.MustParseAddrPort("198.19.0.30:80"), netip.MustParseAddrPort("198.19.0.31:53")
			ep := []lb.Endpoint{{Addr: netip.AddrPortFrom(b0.Addr, 8080), Ready: true, Serving: true, NodeName: nodeName}}
			other := lb.Service{Name: svcName("other"), Port: 80, Endpoints: ep, ClusterIPs: []netip.Addr{netip.MustParseAddr("198.19.0.39")}}
			st := store(t, other)
			m, err := New(Config{Exec: &netfilter.Exec{NetNS: top.Node.NS, Variant: variant}, Logger: zaptest.NewLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			mustApply(t, m, st.Snapshot(), true)
			t.Cleanup(func() { _ = m.Cleanup(ctx) })
			topology.SamePorts(t, top.Clients[0], web, dns, b0.Name, func() {
				if _, err := st.Update([]lb.Service{
					{Name: svcName("web"), Port: 80, Endpoints: ep, ClusterIPs: []netip.Addr{web.Addr()}},
					{Name: svcName("dns"), Protocol: lb.UDP, Port: 53, Endpoints: ep, ClusterIPs: []netip.Addr{dns.Addr()}},
				}, nil); err != nil {
					t.Fatal(err)
				}
				mustApply(t, m, st.Snapshot(), false)
			})
			if got := m.UnservedCleared(); got != 2 {
				t.Errorf("UnservedCleared = %d, want 2 (the SYN's entry and the datagram's)", got)
			}
		})
	}
}
