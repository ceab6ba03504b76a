package kerneltest

import (
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Dial dials addr from inside namespace ns, with SO_MARK mark unless it is
// zero.
func Dial(tb testing.TB, ns, network, addr string, timeout time.Duration, mark int) (net.Conn, error) {
	tb.Helper()
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
	Do(tb, ns, func() { c, err = d.Dial(network, addr) })
	return c, err
}
