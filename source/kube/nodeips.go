package kube

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"
)

// PrimaryIPs returns the node's primary IPs, at most one per family, the
// first being the primary family's, as kube-proxy finds them: the Node's
// InternalIP addresses first, then its ExternalIP ones; the first address
// and the first of the other family. bindAddress, unless unspecified or
// invalid, replaces the address of its family and makes that family the
// primary one (kube-proxy's --bind-address). Nil when nothing is known:
// kube-proxy then serves NodePorts on every address.
func PrimaryIPs(node *v1.Node, bindAddress netip.Addr) []netip.Addr {
	var all []netip.Addr
	if node != nil {
		for _, typ := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
			for _, a := range node.Status.Addresses {
				if a.Type != typ {
					continue
				}
				if ip, err := netip.ParseAddr(a.Address); err == nil {
					all = append(all, ip.Unmap())
				}
			}
		}
	}
	var out []netip.Addr
	if len(all) > 0 {
		out = append(out, all[0])
		for _, ip := range all[1:] {
			if ip.Is4() != all[0].Is4() {
				out = append(out, ip)
				break
			}
		}
	}
	if !bindAddress.IsValid() || bindAddress.IsUnspecified() {
		return out
	}
	bind := bindAddress.Unmap()
	primary := []netip.Addr{bind}
	for _, ip := range out {
		if ip.Is4() != bind.Is4() {
			primary = append(primary, ip)
		}
	}
	return primary
}
