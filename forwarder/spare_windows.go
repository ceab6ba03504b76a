package forwarder

import (
	"net"
	"net/netip"

	"golang.org/x/sys/windows"
)

// holdSpare does nothing on Windows: there is no per-process descriptor
// table to keep a slot in, so accept only backs off there.
func holdSpare() {}

// refuseQueuedTCP cannot refuse on Windows; see holdSpare.
func refuseQueuedTCP(*net.TCPListener, func(netip.AddrPort)) error { return windows.WSAEMFILE }
