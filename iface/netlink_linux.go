package iface

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Netlink manages interfaces and addresses over rtnetlink.
type Netlink struct {
	h *netlink.Handle
}

// New opens an rtnetlink socket in network namespace ns
// (netns.None(): the caller's). Only NETLINK_ROUTE is opened: asking
// netlink for every family fails on kernels missing some of them.
func New(ns netns.NsHandle) (*Netlink, error) {
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening rtnetlink socket: %w", err)
	}
	return &Netlink{h: h}, nil
}

// Close closes the socket.
func (l *Netlink) Close() { l.h.Close() }

func (l *Netlink) link(name string) (netlink.Link, error) {
	link, err := l.h.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) || errors.Is(err, unix.ENODEV) {
		return nil, fmt.Errorf("%s: %w", name, ErrNoLink)
	}
	return link, err
}

// EnsureDummy implements the consumers' Links (package ipvs, package
// userspace). On a kernel without the dummy driver (CONFIG_DUMMY) the
// interface is an empty bridge, left down, which holds local addresses
// the same way: no ports, so nothing is ever sent or received on it.
func (l *Netlink) EnsureDummy(ctx context.Context, name string) error {
	link, err := l.link(name)
	switch {
	case err == nil && link.Type() != "dummy" && !emptyBridge(l.h, link):
		return fmt.Errorf("interface %s exists and is a %s, not a dummy", name, link.Type())
	case err == nil:
		return nil
	case !errors.Is(err, ErrNoLink):
		return err
	}
	attrs := netlink.LinkAttrs{Name: name}
	err = l.h.LinkAdd(&netlink.Dummy{LinkAttrs: attrs})
	if errors.Is(err, unix.EOPNOTSUPP) {
		err = l.h.LinkAdd(&netlink.Bridge{LinkAttrs: attrs})
	}
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}

// emptyBridge tells whether link is a bridge without ports: what
// EnsureDummy makes where there is no dummy driver.
func emptyBridge(h *netlink.Handle, link netlink.Link) bool {
	if link.Type() != "bridge" {
		return false
	}
	links, err := h.LinkList()
	if err != nil {
		return false
	}
	for _, port := range links {
		if port.Attrs().MasterIndex == link.Attrs().Index {
			return false
		}
	}
	return true
}

// DeleteLink implements the consumers' Links (package ipvs, package userspace).
func (l *Netlink) DeleteLink(ctx context.Context, name string) error {
	link, err := l.link(name)
	if errors.Is(err, ErrNoLink) {
		return nil
	}
	if err != nil {
		return err
	}
	return l.h.LinkDel(link)
}

// Addrs implements the consumers' Links (package ipvs, package userspace).
func (l *Netlink) Addrs(ctx context.Context, name string) ([]netip.Addr, error) {
	link, err := l.link(name)
	if err != nil {
		return nil, err
	}
	addrs, err := l.h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

func hostNet(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}
}

// AddAddr implements the consumers' Links (package ipvs, package userspace).
func (l *Netlink) AddAddr(ctx context.Context, name string, addr netip.Addr) error {
	link, err := l.link(name)
	if err != nil {
		return err
	}
	a := &netlink.Addr{IPNet: hostNet(addr)}
	if addr.Is6() {
		// Usable at once: duplicate address detection would keep a
		// virtual IP tentative (and unbindable) for a second or more,
		// and on a link that is down, until it comes up.
		a.Flags = unix.IFA_F_NODAD
	}
	err = l.h.AddrAdd(link, a)
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}

// DelAddr implements the consumers' Links (package ipvs, package userspace).
func (l *Netlink) DelAddr(ctx context.Context, name string, addr netip.Addr) error {
	link, err := l.link(name)
	if err != nil {
		return err
	}
	err = l.h.AddrDel(link, &netlink.Addr{IPNet: hostNet(addr)})
	if errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

// NodeAddrs implements the consumers' Links (package ipvs, package userspace).
func (l *Netlink) NodeAddrs(ctx context.Context, exclude string) ([]netip.Addr, error) {
	links, err := l.h.LinkList()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, link := range links {
		attrs := link.Attrs()
		if attrs.Name == exclude || attrs.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := l.h.AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("listing addresses of %s: %w", attrs.Name, err)
		}
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if ip = ip.Unmap(); ok && ip.IsGlobalUnicast() && !slices.Contains(out, ip) {
				out = append(out, ip)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}
