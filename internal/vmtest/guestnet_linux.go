package vmtest

import (
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// GuestHost is a network namespace of a guest's topology, joined to the
// node (the guest's initial namespace) by a veth in the CNI ptp shape:
// /32 addresses on both ends, a link-scope route to the other end on
// each, and the node as the host's gateway.
type GuestHost struct {
	Name string
	NS   netns.NsHandle // netns.None() for the node itself
	IP   netip.Addr
	Link string // the node's end of the veth; empty for the node
}

// InitNode makes the calling thread's namespace (the guest's initial one)
// the node: loopback up, IPv4 forwarding on.
func InitNode() error {
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); err != nil {
		return err
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	return h.LinkSetUp(lo)
}

// AddGuestHost makes a namespace with ip on its eth0, joined by the veth
// "v-"+name to the node, whose end has nodeIP. On error it removes what it
// made.
func AddGuestHost(name string, ip, nodeIP netip.Addr) (GuestHost, error) {
	node, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return GuestHost{}, err
	}
	defer node.Close()
	ns, err := NewNetNS()
	if err != nil {
		return GuestHost{}, err
	}
	h := GuestHost{Name: name, NS: ns, IP: ip, Link: "v-" + name}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: h.Link}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}
	if err := node.LinkAdd(veth); err != nil {
		ns.Close()
		return GuestHost{}, fmt.Errorf("veth for %s: %w", name, err)
	}
	if err := h.plumb(node, nodeIP); err != nil {
		h.Close()
		return GuestHost{}, fmt.Errorf("setting up %s: %w", name, err)
	}
	return h, nil
}

func (h GuestHost) plumb(node *netlink.Handle, nodeIP netip.Addr) error {
	nl, err := node.LinkByName(h.Link)
	if err != nil {
		return err
	}
	if err := node.AddrAdd(nl, &netlink.Addr{IPNet: &net.IPNet{IP: nodeIP.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		return err
	}
	if err := node.LinkSetUp(nl); err != nil {
		return err
	}
	if err := node.RouteAdd(HostRoute(nl, h.IP)); err != nil {
		return err
	}
	in, err := netlink.NewHandleAt(h.NS, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer in.Close()
	for _, n := range []string{"lo", "eth0"} {
		l, err := in.LinkByName(n)
		if err != nil {
			return err
		}
		if err := in.LinkSetUp(l); err != nil {
			return err
		}
	}
	eth0, err := in.LinkByName("eth0")
	if err != nil {
		return err
	}
	if err := in.AddrAdd(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: h.IP.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		return err
	}
	if err := in.RouteAdd(HostRoute(eth0, nodeIP)); err != nil {
		return err
	}
	if err := in.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: nodeIP.AsSlice()}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}

// Close removes h's veth (its peer goes with it) and closes its namespace
// handle; the namespace goes with its last reference.
func (h GuestHost) Close() {
	if h.Link == "" {
		return
	}
	if node, err := netlink.NewHandle(unix.NETLINK_ROUTE); err == nil {
		if l, err := node.LinkByName(h.Link); err == nil {
			_ = node.LinkDel(l)
		}
		node.Close()
	}
	h.NS.Close()
}
