package forwarder

import (
	"errors"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/windows"
)

// readWaiter waits until a socket is readable without a buffer. On
// Windows, a RawConn.Read callback that says "not yet" makes Go post a
// zero-byte overlapped read, which completes once bytes, EOF or an error
// are there; the callback then says done. The read deadline applies.
type readWaiter struct {
	asked bool
	fn    func(fd uintptr) bool
}

func (w *readWaiter) init() { w.fn = w.ready }

func (w *readWaiter) wait(rc syscall.RawConn) error {
	w.asked = false
	return rc.Read(w.fn)
}

func (w *readWaiter) ready(uintptr) bool {
	if w.asked {
		return true
	}
	w.asked = true
	return false
}

// peekGone waits until c is readable and reports whether the client has gone
// (EOF or an error) rather than sent data. It returns early, with gone false,
// when c's read deadline passes.
func peekGone(c *net.TCPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	asked, gone := false, false
	err = rc.Read(func(fd uintptr) bool {
		if !asked {
			asked = true
			return false // wait with a zero-byte read (see readWaiter)
		}
		var b byte
		buf := windows.WSABuf{Len: 1, Buf: &b}
		var n uint32
		flags := uint32(windows.MSG_PEEK)
		perr := windows.WSARecv(windows.Handle(fd), &buf, 1, &n, &flags, nil, nil)
		if perr == windows.WSAEWOULDBLOCK {
			return false
		}
		gone = n == 0 || perr != nil
		return true
	})
	if err != nil {
		// The zero-byte read failed: the client reset, unless the
		// deadline or a close ended the wait.
		return !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, net.ErrClosed)
	}
	return gone
}

// isFDLimit reports whether an accept error is a socket-handle or buffer
// shortage, after which accept must back off rather than spin.
func isFDLimit(err error) bool {
	return errors.Is(err, windows.WSAEMFILE) || errors.Is(err, windows.WSAENOBUFS)
}

// isLocalDialError reports whether a failure to open or start a backend
// connection was this host's (out of socket handles, buffers or local
// ports), not the backend's: it is never held against the backend.
func isLocalDialError(err error) bool {
	return isFDLimit(err) || errors.Is(err, windows.WSAEADDRNOTAVAIL)
}

// isRefused reports whether a dial error is a refusal or reset by the backend.
func isRefused(err error) bool {
	return errors.Is(err, windows.WSAECONNREFUSED) || errors.Is(err, windows.WSAECONNRESET) ||
		errors.Is(err, windows.WSAEHOSTUNREACH) || errors.Is(err, windows.WSAENETUNREACH)
}
