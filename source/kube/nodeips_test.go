package kube

import (
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestPrimaryIPs(t *testing.T) {
	node := func(addrs ...v1.NodeAddress) *v1.Node {
		return &v1.Node{Status: v1.NodeStatus{Addresses: addrs}}
	}
	internal := func(a string) v1.NodeAddress { return v1.NodeAddress{Type: v1.NodeInternalIP, Address: a} }
	external := func(a string) v1.NodeAddress { return v1.NodeAddress{Type: v1.NodeExternalIP, Address: a} }
	hostname := v1.NodeAddress{Type: v1.NodeHostName, Address: "node-a"}
	for _, tc := range []struct {
		name string
		node *v1.Node
		bind string
		want []string
	}{
		{"no node", nil, "0.0.0.0", nil},
		{"no node, bind address", nil, "10.0.0.9", []string{"10.0.0.9"}},
		{"hostname only", node(hostname), "0.0.0.0", nil},
		{"internal first", node(external("203.0.113.5"), internal("10.0.0.5"), internal("10.0.0.6")), "0.0.0.0", []string{"10.0.0.5"}},
		{"external when no internal", node(hostname, external("203.0.113.5")), "", []string{"203.0.113.5"}},
		{"dual stack", node(internal("10.0.0.5"), internal("10.0.0.6"), internal("fd00::5")), "::", []string{"10.0.0.5", "fd00::5"}},
		{"IPv6 primary", node(internal("fd00::5"), internal("10.0.0.5")), "0.0.0.0", []string{"fd00::5", "10.0.0.5"}},
		{"bind address replaces its family", node(internal("10.0.0.5"), internal("fd00::5")), "10.0.0.9", []string{"10.0.0.9", "fd00::5"}},
		{"bind address makes its family primary", node(internal("10.0.0.5"), internal("fd00::5")), "fd00::9", []string{"fd00::9", "10.0.0.5"}},
		{"garbage skipped", node(internal("nope"), internal("10.0.0.5")), "", []string{"10.0.0.5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bind, _ := netip.ParseAddr(tc.bind)
			var got []string
			for _, ip := range PrimaryIPs(tc.node, bind) {
				got = append(got, ip.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("PrimaryIPs = %v, want %v", got, tc.want)
			}
		})
	}
}
