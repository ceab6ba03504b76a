//go:build unix && !linux

package forwarder

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// readWaiter waits until a socket is readable without reading from it: its
// callback peeks at one byte and asks Go's poller to wait while there is
// none. EOF and errors count as readable; the read that follows sees them.
type readWaiter struct {
	fn func(fd uintptr) bool
	b  [1]byte
}

func (w *readWaiter) init() { w.fn = w.ready }

func (w *readWaiter) wait(rc syscall.RawConn) error { return rc.Read(w.fn) }

func (w *readWaiter) ready(fd uintptr) bool {
	_, _, err := unix.Recvfrom(int(fd), w.b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	return err != unix.EAGAIN && err != unix.EINTR
}
