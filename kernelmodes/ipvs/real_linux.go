package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Available reports whether this kernel has IPVS: nil when its generic
// netlink family is registered (after trying `modprobe ip_vs`, as
// kube-proxy does, when it is not), else an error wrapping ErrUnavailable
// that says why. It looks at the caller's network namespace.
func Available() error {
	err := ipvsFamily()
	if err == nil {
		return nil
	}
	if path, lerr := exec.LookPath("modprobe"); lerr == nil {
		if out, merr := exec.Command(path, "ip_vs").CombinedOutput(); merr != nil {
			err = fmt.Errorf("%w (modprobe ip_vs: %v: %s)", err, merr, strings.TrimSpace(string(out)))
		} else if err = ipvsFamily(); err == nil {
			return nil
		}
	}
	return fmt.Errorf("%w: the kernel has no IPVS netlink family (ip_vs is neither built in nor loaded): %v", ErrUnavailable, err)
}

func ipvsFamily() error {
	h, err := netlink.NewHandle(unix.NETLINK_GENERIC)
	if err != nil {
		return fmt.Errorf("opening a generic netlink socket: %w", err)
	}
	defer h.Close()
	if _, err := h.GenlFamilyGet("IPVS"); err != nil {
		return fmt.Errorf("looking up the IPVS generic netlink family: %w", err)
	}
	return nil
}

// NewIPVS returns a moby/ipvs handle in the caller's network namespace, or
// an error wrapping ErrUnavailable when the kernel has no IPVS. (moby/ipvs
// looks the IPVS netlink family up once per process: create the first
// handle after loading ip_vs.)
func NewIPVS() (*ipvs.Handle, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	h, err := ipvs.New("")
	if err != nil {
		return nil, fmt.Errorf("opening IPVS netlink socket: %w", err)
	}
	return h, nil
}

// NetlinkLinks is the real Links, over rtnetlink.
type NetlinkLinks struct {
	h *netlink.Handle
}

var _ Links = (*NetlinkLinks)(nil)

// NewLinks opens an rtnetlink socket in network namespace ns
// (netns.None(): the caller's). Only NETLINK_ROUTE is opened: asking
// netlink for every family fails on kernels missing some of them.
func NewLinks(ns netns.NsHandle) (*NetlinkLinks, error) {
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening rtnetlink socket: %w", err)
	}
	return &NetlinkLinks{h: h}, nil
}

// Close closes the socket.
func (l *NetlinkLinks) Close() { l.h.Close() }

func (l *NetlinkLinks) link(name string) (netlink.Link, error) {
	link, err := l.h.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) || errors.Is(err, unix.ENODEV) {
		return nil, fmt.Errorf("%s: %w", name, ErrNoLink)
	}
	return link, err
}

// EnsureDummy implements Links.
func (l *NetlinkLinks) EnsureDummy(ctx context.Context, name string) error {
	link, err := l.link(name)
	switch {
	case err == nil && link.Type() != "dummy":
		return fmt.Errorf("interface %s exists and is a %s, not a dummy", name, link.Type())
	case err == nil:
		return nil
	case !errors.Is(err, ErrNoLink):
		return err
	}
	err = l.h.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}})
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}

// DeleteLink implements Links.
func (l *NetlinkLinks) DeleteLink(ctx context.Context, name string) error {
	link, err := l.link(name)
	if errors.Is(err, ErrNoLink) {
		return nil
	}
	if err != nil {
		return err
	}
	return l.h.LinkDel(link)
}

// Addrs implements Links.
func (l *NetlinkLinks) Addrs(ctx context.Context, name string) ([]netip.Addr, error) {
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

// AddAddr implements Links.
func (l *NetlinkLinks) AddAddr(ctx context.Context, name string, addr netip.Addr) error {
	link, err := l.link(name)
	if err != nil {
		return err
	}
	err = l.h.AddrAdd(link, &netlink.Addr{IPNet: hostNet(addr)})
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}

// DelAddr implements Links.
func (l *NetlinkLinks) DelAddr(ctx context.Context, name string, addr netip.Addr) error {
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

// NodeAddrs implements Links.
func (l *NetlinkLinks) NodeAddrs(ctx context.Context, exclude string) ([]netip.Addr, error) {
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

// NetlinkConntrack is the real Conntrack, over ctnetlink. The socket is
// opened on first use, so a node without ctnetlink fails only then.
type NetlinkConntrack struct {
	ns   netns.NsHandle
	once sync.Once
	h    *netlink.Handle
	err  error
}

var _ Conntrack = (*NetlinkConntrack)(nil)

// NewConntrack returns the real Conntrack for network namespace ns
// (netns.None(): the caller's).
func NewConntrack(ns netns.NsHandle) *NetlinkConntrack { return &NetlinkConntrack{ns: ns} }

// ClearUDP implements Conntrack. It is `conntrack -D -p udp --orig-dst vip
// --orig-port-dst port --reply-src backend-ip --reply-port-src backend-port`.
func (c *NetlinkConntrack) ClearUDP(ctx context.Context, vip netip.Addr, port uint16, backend netip.AddrPort) error {
	c.once.Do(func() {
		c.h, c.err = netlink.NewHandleAt(c.ns, unix.NETLINK_NETFILTER)
	})
	if c.err != nil {
		return fmt.Errorf("opening ctnetlink socket: %w", c.err)
	}
	fam := netlink.InetFamily(unix.AF_INET)
	if vip.Is6() {
		fam = unix.AF_INET6
	}
	_, err := c.h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, udpFlow{vip, port, backend})
	return err
}

type udpFlow struct {
	vip     netip.Addr
	port    uint16
	backend netip.AddrPort
}

func (f udpFlow) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	dst, _ := netip.AddrFromSlice(flow.Forward.DstIP)
	src, _ := netip.AddrFromSlice(flow.Reverse.SrcIP)
	return flow.Forward.Protocol == syscall.IPPROTO_UDP &&
		dst.Unmap() == f.vip && flow.Forward.DstPort == f.port &&
		src.Unmap() == f.backend.Addr() && flow.Reverse.SrcPort == f.backend.Port()
}
