package forwarder

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/lb"
)

// TestRedirectBothFamilies: redirect listeners on 0.0.0.0:p and [::]:p
// share the port, the IPv6 ones IPv6-only; a UDP NodePort gets a socket of
// each family, keyed as redirect.Ports.UDP expects; the IPv6 one forwards
// real datagrams; and a successor takes over every socket of both families
// by name rather than binding anew.
func TestRedirectBothFamilies(t *testing.T) {
	if _, err := net.ListenPacket("udp6", "[::1]:0"); err != nil {
		t.Skipf("skipping: no IPv6 loopback here: %v", err)
	}
	leakCheck(t)
	port := freeDualPort(t)
	np := freeUDPFrontend(t).Port()
	e := startUDPEcho(t, "np")
	svc := udpService("np", netip.AddrPortFrom(netip.MustParseAddr("198.18.255.1"), 53), e.addr)
	svc.ClusterIPs = append(svc.ClusterIPs, netip.MustParseAddr("fd00:19::53"))
	svc.NodePort = np
	snap, err := lb.NewStore(lb.StoreOptions{}).Replace([]lb.Service{svc})
	if err != nil {
		t.Fatal(err)
	}
	v4, v6 := netip.AddrPortFrom(netip.IPv4Unspecified(), port), netip.AddrPortFrom(netip.IPv6Unspecified(), port)
	cfg := Config{Engine: testEngine, Redirect: []netip.AddrPort{v4, v6}, Mark: -1, Workers: 2, Logger: zaptest.NewLogger(t)}
	a, err := New(cfg)
	if err != nil {
		t.Fatalf("listening on %v and %v: %v", v4, v6, err)
	}
	t.Cleanup(func() { shutdown(a) })
	if err := a.Apply(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	if got, want := a.RedirectAddrs(), []netip.AddrPort{v4, v6}; !slices.Equal(got, want) {
		t.Errorf("RedirectAddrs() = %v, want %v", got, want)
	}
	ports := a.UDPPorts()
	np4, np6 := lb.Frontend{Protocol: lb.UDP, Addr: netip.AddrPortFrom(netip.IPv4Unspecified(), np)}, lb.Frontend{Protocol: lb.UDP, Addr: netip.AddrPortFrom(netip.IPv6Unspecified(), np)}
	if ports[np4] == 0 || ports[np6] == 0 {
		t.Fatalf("UDPPorts() = %v, want a socket for %v and for %v", ports, np4, np6)
	}

	// The IPv6 NodePort socket forwards: a datagram to it (as REDIRECT
	// delivers one) reaches the Service's backend and the reply comes
	// back from the address it was sent to.
	c, err := net.DialUDP("udp6", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.IPv6Loopback(), ports[np6])))
	if err != nil {
		t.Fatal(err)
	}
	reply, err := ask(c, []byte("q6"))
	c.Close()
	if err != nil || string(reply) != "np q6" {
		t.Fatalf("through the IPv6 NodePort socket: %q, %v; want %q", reply, err, "np q6")
	}

	files, err := a.Sockets()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	want := []string{
		fmt.Sprintf("tcp/redirect/%v/0", v4), fmt.Sprintf("tcp/redirect/%v/1", v4),
		fmt.Sprintf("tcp/redirect/%v/0", v6), fmt.Sprintf("tcp/redirect/%v/1", v6),
		"udp/" + np4.Addr.String(), "udp/198.18.255.1:53", "udp/" + np6.Addr.String(), "udp/[fd00:19::53]:53",
	}
	if !slices.Equal(names, want) {
		t.Errorf("handed over %q, want %q", names, want)
	}
	for name, file := range files {
		if !strings.HasPrefix(name, "tcp/redirect/[") {
			continue
		}
		var v int
		if err := control(file, func(fd int) (err error) {
			v, err = unix.GetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY)
			return err
		}); err != nil || v != 1 {
			t.Errorf("%s: IPV6_V6ONLY = %d, %v; want 1 (0.0.0.0:%d takes IPv4)", name, v, err, port)
		}
	}

	handed := map[string]uint64{}
	for name, file := range files {
		handed[name] = socketInode(t, file)
	}
	cfg.Inherited = files // New takes them and closes them
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(b) })
	if err := b.Apply(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	inherited, err := b.Sockets()
	if err != nil {
		t.Fatal(err)
	}
	for name, file := range inherited {
		if got, want := socketInode(t, file), handed[name]; got != want {
			t.Errorf("successor's %s is a new socket (inode %d), not the one handed over (%d)", name, got, want)
		}
		file.Close()
	}
	if len(inherited) != len(handed) {
		t.Errorf("successor holds %d sockets, predecessor handed over %d", len(inherited), len(handed))
	}
}

// TestFrontendsUDPNodePortBothFamilies: with frontends bound directly (local
// steering, or none), a UDP NodePort gets an IPv4 and, when the node serves
// IPv6, an IPv6 socket, and the IPv6 one forwards; without Config.IPv6 only
// the IPv4 one.
func TestFrontendsUDPNodePortBothFamilies(t *testing.T) {
	if _, err := net.ListenPacket("udp6", "[::1]:0"); err != nil {
		t.Skipf("skipping: no IPv6 loopback here: %v", err)
	}
	leakCheck(t)
	e := startUDPEcho(t, "np")
	for _, ipv6 := range []bool{true, false} {
		t.Run(fmt.Sprintf("IPv6=%v", ipv6), func(t *testing.T) {
			np := freeUDPFrontend(t).Port()
			svc := udpService("np", freeUDPFrontend(t), e.addr)
			svc.NodePort = np
			snap, err := lb.NewStore(lb.StoreOptions{}).Replace([]lb.Service{svc})
			if err != nil {
				t.Fatal(err)
			}
			a, err := New(Config{Engine: testEngine, BindFrontends: true, IPv6: ipv6, Mark: -1, Workers: 2, Logger: zaptest.NewLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { shutdown(a) })
			if err := a.Apply(context.Background(), snap); err != nil {
				t.Fatal(err)
			}
			np6 := lb.Frontend{Protocol: lb.UDP, Addr: netip.AddrPortFrom(netip.IPv6Unspecified(), np)}
			np4 := lb.Frontend{Protocol: lb.UDP, Addr: netip.AddrPortFrom(netip.IPv4Unspecified(), np)}
			ports := a.UDPPorts()
			if ports[np4] != np {
				t.Errorf("UDPPorts() = %v, want %v on port %d", ports, np4, np)
			}
			if !ipv6 {
				if _, ok := ports[np6]; ok {
					t.Errorf("UDPPorts() = %v: an IPv6 NodePort socket on a node without IPv6", ports)
				}
				return
			}
			if ports[np6] != np {
				t.Fatalf("UDPPorts() = %v, want %v on port %d", ports, np6, np)
			}
			c, err := net.DialUDP("udp6", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.IPv6Loopback(), np)))
			if err != nil {
				t.Fatal(err)
			}
			reply, err := ask(c, []byte("q6"))
			c.Close()
			if err != nil || string(reply) != "np q6" {
				t.Fatalf("through [::1]:%d: %q, %v; want %q", np, reply, err, "np q6")
			}
		})
	}
}

func shutdown(f *Forwarder) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = f.Shutdown(ctx)
}

// freeDualPort returns a TCP port free on 0.0.0.0 and on [::].
func freeDualPort(t *testing.T) uint16 {
	t.Helper()
	return freePort(t, "tcp", netip.IPv6Unspecified()).Port() // dual-stack: checks both families
}

// socketInode is the inode of f's socket. It reads it through SyscallConn:
// Fd would make the description, shared with the forwarder's socket,
// blocking.
func socketInode(t *testing.T, f *os.File) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := control(f, func(fd int) error { return unix.Fstat(fd, &st) }); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}
