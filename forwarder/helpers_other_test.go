//go:build !linux

package forwarder

import (
	"net/netip"
	"runtime"
	"testing"
)

// blackholeAddr would be a loopback address whose connects hang; it takes a
// listen queue that drops SYNs, which only Linux gives (backlog 0, full).
func blackholeAddr(t testing.TB) netip.AddrPort {
	t.Helper()
	t.Skipf("no loopback address that drops SYNs on %s", runtime.GOOS)
	return netip.AddrPort{}
}

// openFDs is 0: open sockets are counted from /proc/self/fd, which only
// Linux has, so leak checks here count goroutines only.
func openFDs(testing.TB) int { return 0 }
