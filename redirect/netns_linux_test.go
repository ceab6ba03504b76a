//go:build linux

package redirect

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/internal/kerneltest"
	"github.com/svcproxy/svcproxy/netfilter"
)

// privileged gates the privileged tests: root, the tools, and a kernel
// with ipsets, xt_set and REDIRECT (probed in a throwaway namespace).
var privileged = kerneltest.Gate{
	Package: "./redirect/",
	Prefix:  "svcproxy-test-",
	Tools:   []string{"ip", "iptables", "iptables-restore", "iptables-save", "ip6tables-restore", "ip6tables-save", "ipset"},
	Probe: func(ns string) error {
		e := netfilter.NewExec(ns)
		ctx := context.Background()
		err := errors.Join(
			e.IPSetRestore(ctx, []byte("create svcproxy-probe hash:ip,port family inet\ncreate svcproxy-probe-p bitmap:port range 0-65535\n")),
			e.IPTablesRestore(ctx, netfilter.IPv4, []byte("*nat\n:SVCPROXY-PROBE - [0:0]\n"+
				"-A SVCPROXY-PROBE -p tcp -m set --match-set svcproxy-probe dst,dst -j REDIRECT --to-ports 1\n"+
				"-A SVCPROXY-PROBE -m addrtype --dst-type LOCAL -m set --match-set svcproxy-probe-p dst -j RETURN\nCOMMIT\n"+
				"*filter\n:SVCPROXY-PROBE - [0:0]\n-A SVCPROXY-PROBE -p tcp -m conntrack --ctstate DNAT -j REJECT --reject-with tcp-reset\nCOMMIT\n")))
		if err != nil {
			return fmt.Errorf("kernel or tools lack ipset / xt_set / REDIRECT / REJECT / addrtype / conntrack: %w", err)
		}
		return nil
	},
}

// topology is a node namespace and a client ("pod") namespace joined by a
// veth pair (this kernel has no dummy interfaces), with no default route.
// Numbered (newTopology):
//
//	client eth0 198.18.0.2/24 fd00:18::2/64  <->  node eth0 198.18.0.1/24 fd00:18::1/64
//
// Unnumbered (newUnnumberedTopology), as Calico wires a pod: the node's
// end has no address but a link-local fe80::1, the node's addresses are
// 198.18.1.1 and fd00:19::1 on lo, and the client reaches everything
// through a link-local gateway (169.254.1.1, which the node's end answers
// for with its MAC; fe80::1):
//
//	client eth0 198.18.0.2/32 fd00:18::2/128  <->  node eth0 (fe80::1)   node lo 198.18.1.1 fd00:19::1
//
// Both route the service ranges 198.18.10.0/24 and fd00:10::/64: the node
// out of eth0 (a locally sent packet needs a route before nat OUTPUT sees
// it), the client via the node, which forwards.
type topology struct {
	node, client string
	// nodeAddrs are the node's addresses the client reaches (IPv4, IPv6).
	nodeAddrs [2]netip.Addr
}

func newTopology(t testing.TB) topology {
	t.Helper()
	top := newVethPair(t)
	top.nodeAddrs = [2]netip.Addr{netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("fd00:18::1")}
	for _, c := range [][]string{
		{top.node, "addr", "add", "198.18.0.1/24", "dev", "eth0"},
		{top.node, "addr", "add", "fd00:18::1/64", "dev", "eth0", "nodad"},
		{top.node, "link", "set", "eth0", "up"},
		{top.node, "route", "add", "198.18.10.0/24", "dev", "eth0"},
		{top.node, "route", "add", "fd00:10::/64", "dev", "eth0"},
		{top.client, "addr", "add", "198.18.0.2/24", "dev", "eth0"},
		{top.client, "addr", "add", "fd00:18::2/64", "dev", "eth0", "nodad"},
		{top.client, "link", "set", "eth0", "up"},
		{top.client, "route", "add", "198.18.10.0/24", "via", "198.18.0.1"},
		{top.client, "route", "add", "fd00:10::/64", "via", "fd00:18::1"},
	} {
		kerneltest.Run(t, "ip", append([]string{"-n"}, c...)...)
	}
	kerneltest.Run(t, "ip", "netns", "exec", top.node, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	return top
}

func newUnnumberedTopology(t testing.TB) topology {
	t.Helper()
	top := newVethPair(t)
	top.nodeAddrs = [2]netip.Addr{netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("fd00:19::1")}
	const mac = "ee:ee:ee:ee:ee:ee" // Calico's host-side MAC
	for _, c := range [][]string{
		{top.node, "link", "set", "eth0", "address", mac},
		{top.node, "addr", "add", "fe80::1/64", "dev", "eth0", "nodad"},
		{top.node, "addr", "add", "198.18.1.1/32", "dev", "lo"},
		{top.node, "addr", "add", "fd00:19::1/128", "dev", "lo"},
		{top.node, "link", "set", "eth0", "up"},
		{top.node, "route", "add", "198.18.0.2/32", "dev", "eth0"},
		{top.node, "route", "add", "fd00:18::2/128", "dev", "eth0"},
		{top.node, "route", "add", "198.18.10.0/24", "dev", "eth0"},
		{top.node, "route", "add", "fd00:10::/64", "dev", "eth0"},
		{top.client, "addr", "add", "198.18.0.2/32", "dev", "eth0"},
		{top.client, "addr", "add", "fd00:18::2/128", "dev", "eth0", "nodad"},
		{top.client, "link", "set", "eth0", "up"},
		{top.client, "route", "add", "169.254.1.1/32", "dev", "eth0", "scope", "link"},
		{top.client, "neigh", "add", "169.254.1.1", "lladdr", mac, "dev", "eth0", "nud", "permanent"},
	} {
		kerneltest.Run(t, "ip", append([]string{"-n"}, c...)...)
	}
	for _, dst := range []string{"198.18.10.0/24", "198.18.1.1/32"} {
		kerneltest.Run(t, "ip", "-n", top.client, "route", "add", dst, "via", "169.254.1.1", "dev", "eth0")
	}
	for _, dst := range []string{"fd00:10::/64", "fd00:19::1/128"} {
		kerneltest.Run(t, "ip", "-n", top.client, "-6", "route", "add", dst, "via", "fe80::1", "dev", "eth0")
	}
	kerneltest.Run(t, "ip", "netns", "exec", top.node, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	return top
}

// newVethPair makes the two namespaces and their veth pair, eth0 in each,
// down and without addresses.
func newVethPair(t testing.TB) topology {
	top := topology{node: privileged.NewNS(t), client: privileged.NewNS(t)}
	veth := "sp" + kerneltest.RandHex(3)
	kerneltest.Run(t, "ip", "-n", top.node, "link", "add", "eth0", "type", "veth", "peer", "name", veth)
	kerneltest.Run(t, "ip", "-n", top.node, "link", "set", veth, "netns", top.client)
	kerneltest.Run(t, "ip", "-n", top.client, "link", "set", veth, "name", "eth0")
	return top
}

// redirectListeners listens in namespace ns on the TCP redirect port, one
// socket per family, as the forwarder does; they close when t ends.
func redirectListeners(t *testing.T, ns string) []net.Listener {
	t.Helper()
	var lns []net.Listener
	kerneltest.Do(t, ns, func() {
		for _, a := range []struct{ network, host string }{{"tcp4", "0.0.0.0"}, {"tcp6", "[::]"}} {
			ln, err := net.Listen(a.network, fmt.Sprintf("%s:%d", a.host, testTCPPort))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			lns = append(lns, ln)
		}
	})
	return lns
}

// acceptRedirected accepts on each of lns until it is closed, closing each
// connection, and sends its SO_ORIGINAL_DST on the channel it returns.
func acceptRedirected(t *testing.T, lns ...net.Listener) <-chan netip.AddrPort {
	accepted := make(chan netip.AddrPort, 16)
	for _, ln := range lns {
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				dst, err := originalDst(c.(*net.TCPConn))
				if err != nil {
					t.Errorf("SO_ORIGINAL_DST: %v", err)
				}
				c.Close()
				accepted <- dst
			}
		}()
	}
	return accepted
}

// originalDst reads SO_ORIGINAL_DST (IP6T_SO_ORIGINAL_DST for netfilter.IPv6) of an
// accepted, redirected connection.
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var out netip.AddrPort
	var serr error
	v6 := netip.MustParseAddrPort(c.LocalAddr().String()).Addr().Is6()
	err = rc.Control(func(fd uintptr) {
		if v6 {
			// sockaddr_in6 fits in IPv6MTUInfo's first 28 bytes.
			var info *unix.IPv6MTUInfo
			if info, serr = unix.GetsockoptIPv6MTUInfo(int(fd), unix.SOL_IPV6, unix.SO_ORIGINAL_DST); serr == nil {
				// The port is in network order in memory.
				var pb [2]byte
				binary.NativeEndian.PutUint16(pb[:], info.Addr.Port)
				out = netip.AddrPortFrom(netip.AddrFrom16(info.Addr.Addr), binary.BigEndian.Uint16(pb[:]))
			}
			return
		}
		// sockaddr_in fits in IPv6Mreq's 20 bytes.
		var m *unix.IPv6Mreq
		if m, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST); serr == nil {
			b := m.Multiaddr
			out = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), binary.BigEndian.Uint16(b[2:4]))
		}
	})
	return out, errors.Join(err, serr)
}

// pktinfoServer is a UDP socket like the forwarder's per-frontend one: it
// answers each datagram with "pong:" + the datagram, sent from the address
// the datagram was (after REDIRECT) addressed to, via IP_PKTINFO, so
// conntrack recognises the reply and un-NATs it to the VIP.
func pktinfoServer(t testing.TB, conn *net.UDPConn) {
	rc, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO, 1) })
	if serr != nil {
		t.Fatalf("setting IP_PKTINFO: %v", serr)
	}
	go func() {
		buf := make([]byte, 2048)
		oob := make([]byte, 256)
		for {
			n, oobn, _, src, err := conn.ReadMsgUDPAddrPort(buf, oob)
			if err != nil {
				return
			}
			var local [4]byte
			msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
			for _, m := range msgs {
				if m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_PKTINFO && len(m.Data) >= 12 {
					copy(local[:], m.Data[8:12]) // struct in_pktinfo: ifindex, spec_dst, addr
				}
			}
			reply := append([]byte("pong:"), buf[:n]...)
			conn.WriteMsgUDPAddrPort(reply, unix.PktInfo4(&unix.Inet4Pktinfo{Spec_dst: local}), src)
		}
	}()
}
