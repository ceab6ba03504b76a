//go:build unix

package forwarder

import (
	"net"
	"net/netip"
	"sync"

	"golang.org/x/sys/unix"
)

// spare is one descriptor the process holds in reserve for when it runs out
// (the libev/libuv "EMFILE trick"): closing it lets accept take one queued
// connection, which is reset at once, and the spare is reopened. Without
// it a client that connects while the process is out of descriptors waits
// in the accept queue until it gives up; with it, it is refused in
// microseconds and can try elsewhere. One per process, shared by every
// listener and worker: it is only touched when accept has already failed.
var spare = struct {
	sync.Mutex
	fd int // -1: not held (never opened, or lost to a race when reopening)
}{fd: -1}

// holdSpare opens the spare descriptor if it is not held.
func holdSpare() {
	spare.Lock()
	defer spare.Unlock()
	holdSpareLocked()
}

func holdSpareLocked() {
	if spare.fd < 0 {
		if fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
			spare.fd = fd
		}
	}
}

// refuseWithSpare frees the spare descriptor, calls accept (which must not
// block) to take one queued connection, resets that connection and takes the
// spare back. It returns the accepted descriptor's error: nil when a client
// was refused, EAGAIN when none was queued, and an error such as EMFILE when
// even the spare did not make room (another thread took it, or the shortage
// is memory). log, if not nil, runs before the reset with the descriptor.
func refuseWithSpare(accept func() (int, error), log func(fd int)) error {
	spare.Lock()
	defer spare.Unlock()
	holdSpareLocked()
	if spare.fd < 0 {
		return unix.EMFILE
	}
	unix.Close(spare.fd)
	spare.fd = -1
	fd, err := accept()
	if err == nil {
		if log != nil {
			log(fd)
		}
		_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
		unix.Close(fd)
	}
	holdSpareLocked()
	return err
}

// refuseQueuedTCP is refuseWithSpare on a net.TCPListener (the goroutine
// engine). Its descriptor is non-blocking, so accept never waits; log gets
// the refused client's address.
func refuseQueuedTCP(ln *net.TCPListener, log func(client netip.AddrPort)) error {
	rc, err := ln.SyscallConn()
	if err != nil {
		return err
	}
	var rerr error
	if err := rc.Control(func(lfd uintptr) {
		var peer unix.Sockaddr
		rerr = refuseWithSpare(func() (int, error) {
			fd, sa, err := unix.Accept(int(lfd))
			peer = sa
			return fd, err
		}, func(int) { log(sockaddrAddrPort(peer)) })
	}); err != nil {
		return err
	}
	return rerr
}

// sockaddrAddrPort converts an IPv4 or IPv6 socket address.
func sockaddrAddrPort(sa unix.Sockaddr) netip.AddrPort {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(sa.Port))
	}
	return netip.AddrPort{}
}
