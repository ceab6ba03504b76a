//go:build unix

package forwarder

import (
	"errors"
	"net"

	"golang.org/x/sys/unix"
)

// peekGone waits until the client on c has gone (EOF with nothing before
// it, or an error) and reports whether it did. It returns early, with gone
// false, when c's read deadline passes. Bytes the client sent keep it
// waiting: a FIN after them is a half-close, for the backend to see, but
// a reset after them must still cancel the dial, and a peek would see the
// bytes, not the reset, whose error waits in SO_ERROR until read.
func peekGone(c *net.TCPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	var b [1]byte
	_ = rc.Read(func(fd uintptr) bool {
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		if err == unix.EAGAIN || err == unix.EINTR {
			return false // not readable yet: wait
		}
		if n == 0 || err != nil {
			gone = true
			return true
		}
		if e, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR); err == nil && e != 0 {
			gone = true
			return true
		}
		return false // bytes: wait for what comes after them
	})
	return gone
}

// isFDLimit reports whether an accept error is a file-descriptor or memory
// shortage, after which accept must back off rather than spin.
func isFDLimit(err error) bool {
	return errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) || errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.ENOMEM)
}

// isLocalDialError reports whether a failure to open or start a backend
// connection was this host's (out of descriptors, buffers, memory, local
// ports or epoll watches: ENOSPC at fs.epoll.max_user_watches), not the
// backend's: it is never held against the backend.
func isLocalDialError(err error) bool {
	return isFDLimit(err) || errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.ENOSPC)
}

// isRefused reports whether a dial error is a refusal or reset by the backend.
func isRefused(err error) bool {
	return errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ECONNRESET) || errors.Is(err, unix.EHOSTUNREACH) || errors.Is(err, unix.ENETUNREACH)
}
