//go:build !linux

package forwarder

import (
	"io"
	"net"
	"sync"
	"syscall"
)

// How bytes move on other systems
//
// There is no splice(2): each chunk is read into a pooled 64 KiB buffer and
// written out with Go's net calls, so deadlines and Close work as they do
// for any net.Conn. A direction first waits until its source is readable
// without a buffer (readWaiter), then borrows one only for the chunk, so
// idle connections hold none.

const bufferSize = 64 << 10 // bytes read at most per chunk

var bufferPool = sync.Pool{New: func() any { b := make([]byte, bufferSize); return &b }}

// shedPipes frees nothing: there are no pipes here.
func shedPipes() int { return 0 }

// splicer moves one direction's chunks by read and write (see above).
type splicer struct {
	src, dst *net.TCPConn
	srcRC    syscall.RawConn
	w        readWaiter
}

func newSplicer() *splicer {
	s := &splicer{}
	s.w.init()
	return s
}

// attach readies s to move src's bytes to dst.
func (s *splicer) attach(src, dst *net.TCPConn) error {
	rc, err := src.SyscallConn()
	if err != nil {
		return err
	}
	s.src, s.dst, s.srcRC = src, dst, rc
	return nil
}

// detach lets go of the connection's sockets.
func (s *splicer) detach() { s.src, s.dst, s.srcRC = nil, nil, nil }

// chunk waits until src has bytes (or EOF, or its read deadline), then
// moves what one read returns to dst. It returns the bytes written; 0 and
// a nil error mean EOF. As on Linux, a read deadline can only strike
// before any byte is taken, and any other error ends the connection.
func (s *splicer) chunk() (int, error) {
	if err := s.w.wait(s.srcRC); err != nil {
		return 0, err
	}
	bp := bufferPool.Get().(*[]byte)
	defer bufferPool.Put(bp)
	n, err := s.src.Read(*bp)
	if n == 0 {
		if err == io.EOF {
			return 0, nil
		}
		return 0, err
	}
	// A read error with bytes (rare) shows again on the next read.
	return s.dst.Write((*bp)[:n])
}
