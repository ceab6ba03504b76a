package conntrack

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// Netlink is the real Table, over ctnetlink in one network namespace. Its
// socket is opened on first use, so a node without ctnetlink fails only
// then.
type Netlink struct {
	ns string // ip netns name; "": the caller's
	mu sync.Mutex
	h  *netlink.Handle // nil: not open yet, or the last try failed
}

var _ Table = (*Netlink)(nil)

// NewNetlink returns the Table of the named network namespace (as ip netns
// knows it; "": the caller's).
func NewNetlink(ns string) *Netlink { return &Netlink{ns: ns} }

// open opens the socket the first time, and again after a failed try.
func (n *Netlink) open() (*netlink.Handle, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.h != nil {
		return n.h, nil
	}
	ns := netns.None()
	if n.ns != "" {
		var err error
		if ns, err = netns.GetFromName(n.ns); err != nil {
			return nil, fmt.Errorf("opening network namespace %s: %w", n.ns, err)
		}
		defer ns.Close()
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("opening ctnetlink socket: %w", err)
	}
	n.h = h
	return h, nil
}

// Delete implements Table: one dump of family's table, then one delete
// message per matching entry.
func (n *Netlink) Delete(ctx context.Context, family netfilter.Family, match func(Flow) bool) (int, error) {
	h, err := n.open()
	if err != nil {
		return 0, err
	}
	fam := netlink.InetFamily(unix.AF_INET)
	if family == netfilter.IPv6 {
		fam = unix.AF_INET6
	}
	deleted, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, filter(match))
	if err != nil {
		return int(deleted), fmt.Errorf("deleting %v conntrack entries: %w", family, err)
	}
	return int(deleted), nil
}

// filter adapts a predicate to the netlink library's filter.
type filter func(Flow) bool

func (f filter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool { return f(flowOf(flow)) }

func flowOf(c *netlink.ConntrackFlow) Flow {
	f := Flow{
		OrigSrc:  addrPort(c.Forward.SrcIP, c.Forward.SrcPort),
		OrigDst:  addrPort(c.Forward.DstIP, c.Forward.DstPort),
		ReplySrc: addrPort(c.Reverse.SrcIP, c.Reverse.SrcPort),
	}
	switch c.Forward.Protocol {
	case unix.IPPROTO_TCP:
		f.Proto = lb.TCP
		if p, ok := c.ProtoInfo.(*netlink.ProtoInfoTCP); ok {
			f.TCPState = TCPState(p.State)
		}
	case unix.IPPROTO_UDP:
		f.Proto = lb.UDP
	case unix.IPPROTO_SCTP:
		f.Proto = lb.SCTP
	default:
		f.Other = true
	}
	return f
}

func addrPort(ip net.IP, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}
