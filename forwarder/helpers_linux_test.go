package forwarder

import (
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// blackholeAddr returns a loopback address whose listen queue is full and
// never accepted, so new connection attempts hang until they time out.
func blackholeAddr(t testing.TB) netip.AddrPort {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, _ := unix.Getsockname(fd)
	addr := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(sa.(*unix.SockaddrInet4).Port))
	// Fill the accept queue (backlog 0 holds one) so later SYNs are dropped.
	var fillers []net.Conn
	for i := 0; i < 2; i++ {
		c, err := net.DialTimeout("tcp", addr.String(), 200*time.Millisecond)
		if err == nil {
			fillers = append(fillers, c)
		}
	}
	t.Cleanup(func() {
		for _, c := range fillers {
			c.Close()
		}
		unix.Close(fd)
	})
	return addr
}

// openPipes counts the pipe descriptors the process opened itself: those
// it inherited (a shell's, CI's) stay open throughout.
func openPipes(t testing.TB) int {
	n := 0
	for fd, target := range fdTargets(t) {
		if strings.HasPrefix(target, "pipe:") && inheritedFDs[fd] != target {
			n++
		}
	}
	return n
}

// inheritedFDs are the descriptors open when the test binary started.
var inheritedFDs = fdTargets(nil)

// fdTargets maps each open descriptor to its /proc/self/fd link.
func fdTargets(t testing.TB) map[string]string {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		if t != nil {
			t.Fatal(err)
		}
		return nil
	}
	m := make(map[string]string, len(ents))
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil {
			m[e.Name()] = target
		}
	}
	return m
}

// openFDs counts open sockets. Pipes are left out: the runtime keeps a pool
// of splice pipes that the garbage collector closes when it likes.
func openFDs(t testing.TB) int {
	n := 0
	for _, target := range fdTargets(t) {
		if strings.HasPrefix(target, "socket:") {
			n++
		}
	}
	return n
}
