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
	ns   string // ip netns name; "": the caller's
	once sync.Once
	h    *netlink.Handle
	err  error
}

var _ Table = (*Netlink)(nil)

// NewNetlink returns the Table of the named network namespace (as ip netns
// knows it; "": the caller's).
func NewNetlink(ns string) *Netlink { return &Netlink{ns: ns} }

func (n *Netlink) open() (*netlink.Handle, error) {
	n.once.Do(func() {
		h := netns.None()
		if n.ns != "" {
			if h, n.err = netns.GetFromName(n.ns); n.err != nil {
				n.err = fmt.Errorf("opening network namespace %s: %w", n.ns, n.err)
				return
			}
			defer h.Close()
		}
		if n.h, n.err = netlink.NewHandleAt(h, unix.NETLINK_NETFILTER); n.err != nil {
			n.err = fmt.Errorf("opening ctnetlink socket: %w", n.err)
		}
	})
	return n.h, n.err
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
	}
	return f
}

func addrPort(ip net.IP, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}
