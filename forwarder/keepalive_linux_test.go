package forwarder

import (
	"bufio"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestKeepaliveOnBothSides: a connection that lives past KeepAlive has TCP
// keepalive on, with KeepAlive as idle time and interval, on the client's
// socket and on the backend's.
func TestKeepaliveOnBothSides(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	be := startBackend(t, "ka", modeName)
	newHarness(t, Config{KeepAlive: time.Second}, service("ka", fe, be.addr))
	c := dial(t, fe)
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	for _, tc := range []struct {
		name string
		peer netip.AddrPort // the proxy's socket whose peer this is
	}{
		{"client side", netip.MustParseAddrPort(c.LocalAddr().String())},
		{"backend side", be.addr},
	} {
		fd := socketWithPeer(t, tc.peer)
		if fd < 0 {
			t.Fatalf("%s: no socket of the proxy's has peer %v", tc.name, tc.peer)
		}
		for _, o := range []struct {
			level, name, want int
			what              string
		}{
			{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1, "SO_KEEPALIVE"},
			{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, 1, "TCP_KEEPIDLE"},
			{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, 1, "TCP_KEEPINTVL"},
		} {
			if v, err := unix.GetsockoptInt(fd, o.level, o.name); err != nil || v != o.want {
				t.Errorf("%s: %s = %d, %v; want %d", tc.name, o.what, v, err, o.want)
			}
		}
	}
}

// socketWithPeer finds a socket of this process connected to peer.
func socketWithPeer(t *testing.T, peer netip.AddrPort) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		sa, err := unix.Getpeername(fd)
		if err != nil {
			continue
		}
		if in4, ok := sa.(*unix.SockaddrInet4); ok && netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port)) == peer {
			return fd
		}
	}
	return -1
}
