package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
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
