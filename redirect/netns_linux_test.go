//go:build linux

package redirect

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/netfilter"
)

// Privileged tests touch only network namespaces they create
// (svcproxy-test-*), never the caller's: every tool runs through
// `ip netns exec`/`ip -n`, every socket is made on a thread moved into the
// namespace.

var (
	privOnce sync.Once
	privSkip string
)

// requirePrivileged skips t unless it runs as root with ip, iptables,
// ip6tables and ipset installed and a kernel with ipsets, xt_set and
// REDIRECT (probed in a throwaway namespace).
func requirePrivileged(t testing.TB) {
	t.Helper()
	privOnce.Do(func() {
		if os.Geteuid() != 0 {
			privSkip = "needs root: run `sudo go test ./redirect/` (the privileged tests only touch namespaces they create)"
			return
		}
		for _, tool := range []string{"ip", "iptables", "iptables-restore", "iptables-save", "ip6tables-restore", "ip6tables-save", "ipset"} {
			if _, err := exec.LookPath(tool); err != nil {
				privSkip = fmt.Sprintf("needs %s on PATH (apt-get install iproute2 iptables ipset): %v", tool, err)
				return
			}
		}
		name := "svcproxy-test-probe-" + randHex(4)
		if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
			privSkip = fmt.Sprintf("cannot create a network namespace: %v: %s", err, out)
			return
		}
		defer exec.Command("ip", "netns", "del", name).Run()
		e := netfilter.NewExec(name)
		ctx := context.Background()
		err := errors.Join(
			e.IPSetRestore(ctx, []byte("create svcproxy-probe hash:ip,port family inet\ncreate svcproxy-probe-p bitmap:port range 0-65535\n")),
			e.IPTablesRestore(ctx, netfilter.IPv4, []byte("*nat\n:SVCPROXY-PROBE - [0:0]\n"+
				"-A SVCPROXY-PROBE -p tcp -m set --match-set svcproxy-probe dst,dst -j REDIRECT --to-ports 1\n"+
				"-A SVCPROXY-PROBE -m addrtype --dst-type LOCAL -m set --match-set svcproxy-probe-p dst -j RETURN\nCOMMIT\n"+
				"*filter\n:SVCPROXY-PROBE - [0:0]\n-A SVCPROXY-PROBE -p tcp -m conntrack --ctstate DNAT -j REJECT --reject-with tcp-reset\nCOMMIT\n")))
		if err != nil {
			privSkip = fmt.Sprintf("kernel or tools lack ipset / xt_set / REDIRECT / REJECT / addrtype / conntrack: %v", err)
		}
	})
	if privSkip != "" {
		t.Skip(privSkip)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// run runs a command and fails t on error.
func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// newNS creates a namespace with lo up, deleted when t ends (also on
// failure).
func newNS(t testing.TB) string {
	t.Helper()
	name := "svcproxy-test-" + randHex(4)
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("deleting namespace %s: %v: %s", name, err, out)
		}
	})
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
	return name
}

// topology is a node namespace and a client ("pod") namespace joined by a
// veth pair (this kernel has no dummy interfaces), with no default route:
//
//	client eth0 198.18.0.2/24 fd00:18::2/64  <->  node eth0 198.18.0.1/24 fd00:18::1/64
//
// Both route the service ranges 198.18.10.0/24 and fd00:10::/64: the node
// out of eth0 (a locally sent packet needs a route before nat OUTPUT sees
// it), the client via the node, which forwards.
type topology struct {
	node, client string
}

var (
	nodeAddr4   = netip.MustParseAddr("198.18.0.1")
	clientAddr4 = netip.MustParseAddr("198.18.0.2")
	nodeAddr6   = netip.MustParseAddr("fd00:18::1")
)

func newTopology(t testing.TB) topology {
	t.Helper()
	top := topology{node: newNS(t), client: newNS(t)}
	veth := "sp" + randHex(3)
	run(t, "ip", "-n", top.node, "link", "add", "eth0", "type", "veth", "peer", "name", veth)
	run(t, "ip", "-n", top.node, "link", "set", veth, "netns", top.client)
	run(t, "ip", "-n", top.client, "link", "set", veth, "name", "eth0")
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
		run(t, "ip", append([]string{"-n"}, c...)...)
	}
	run(t, "ip", "netns", "exec", top.node, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	return top
}

// inNS runs fn on a thread inside namespace ns; sockets fn creates live
// there.
func inNS(t testing.TB, ns string, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("opening own namespace: %v", err)
	}
	defer orig.Close()
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("opening namespace %s: %v", ns, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("entering namespace %s: %v", ns, err)
	}
	defer func() {
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: the runtime retires it with the
			// goroutine instead of reusing it in the wrong namespace.
			t.Errorf("leaving namespace %s: %v", ns, err)
			return
		}
		runtime.UnlockOSThread()
	}()
	fn()
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

// iptablesState is what a namespace's tables and sets look like, with
// counters and comments stripped.
func iptablesState(t testing.TB, ns, variant string) string {
	t.Helper()
	e := &netfilter.Exec{NetNS: ns, Variant: variant}
	var b strings.Builder
	counters := regexp.MustCompile(`\[\d+:\d+\]`)
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		for _, tbl := range []string{"nat", "filter"} {
			out, err := e.IPTablesSave(context.Background(), fam, tbl)
			if err != nil {
				t.Fatalf("saving %v %s: %v", fam, tbl, err)
			}
			for line := range strings.Lines(string(out)) {
				if !strings.HasPrefix(line, "#") {
					b.WriteString(counters.ReplaceAllString(line, "[0:0]"))
				}
			}
		}
	}
	out, err := exec.Command("ip", "netns", "exec", ns, "ipset", "save").CombinedOutput()
	if err != nil {
		t.Fatalf("ipset save: %v: %s", err, out)
	}
	b.WriteString(regexp.MustCompile(` initval 0x[0-9a-f]+`).ReplaceAllString(string(out), ""))
	return b.String()
}

// dialIn dials addr from inside ns.
func dialIn(t testing.TB, ns, network, addr string, timeout time.Duration, mark int) (net.Conn, error) {
	t.Helper()
	var c net.Conn
	var err error
	d := net.Dialer{Timeout: timeout}
	if mark != 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, mark) })
			return serr
		}
	}
	inNS(t, ns, func() { c, err = d.Dial(network, addr) })
	return c, err
}
