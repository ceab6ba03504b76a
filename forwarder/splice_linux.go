package forwarder

import (
	"errors"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Why not (*net.TCPConn).ReadFrom: it splices too, but holds a pipe (two
// file descriptors, sized 1 MiB) for as long as the call lasts, which for a
// proxy is the life of the connection. 10,000 idle connections would pin
// 40,000 pipe descriptors. Here a pipe is taken from a pool only once the
// source socket is readable and goes back as soon as it is empty again, so
// idle connections hold none and the pool stays the size of the in-flight
// transfers.

// pipeSize is the capacity asked of each pipe: the most one splice moves.
const pipeSize = 1 << 20

var errNoPipe = errors.New("creating splice pipe")

type pipe struct {
	r, w int
	data int // bytes in the pipe
}

var pipePool = sync.Pool{New: func() any {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil
	}
	// A smaller pipe still works, with more system calls.
	_, _ = unix.FcntlInt(uintptr(fds[0]), unix.F_SETPIPE_SZ, pipeSize)
	p := &pipe{r: fds[0], w: fds[1]}
	runtime.SetFinalizer(p, (*pipe).close)
	return p
}}

func getPipe() *pipe {
	p, _ := pipePool.Get().(*pipe)
	return p
}

// putPipe pools p if it is empty and closes it otherwise: bytes stranded
// in a pipe must never reach another connection.
func putPipe(p *pipe) {
	if p.data == 0 {
		pipePool.Put(p)
		return
	}
	runtime.SetFinalizer(p, nil)
	p.close()
}

func (p *pipe) close() {
	unix.Close(p.r)
	unix.Close(p.w)
}

// splicer moves bytes from one socket to another with splice(2). Its
// callbacks are bound once, when the pooled conn is made, so a chunk costs no
// allocation.
type splicer struct {
	src, dst syscall.RawConn

	p    *pipe
	n    int   // bytes taken from src in this chunk
	err  error // the syscall error inside a callback
	read func(fd uintptr) bool
	pump func(fd uintptr) bool
}

func newSplicer() *splicer {
	s := &splicer{}
	s.read, s.pump = s.readFn, s.pumpFn
	return s
}

// chunk waits until src has bytes (or EOF, or its read deadline), then
// moves what it has, up to pipeSize, to dst through a pipe, without copying
// through user space. It returns the bytes moved; 0 and a nil error mean
// EOF. When it fails after taking bytes from src, those bytes are lost, so
// the caller must end the connection on any error but a read deadline
// (which can only strike before any byte is taken).
func (s *splicer) chunk() (int, error) {
	s.p, s.n, s.err = nil, 0, nil
	err := s.src.Read(s.read)
	if err == nil {
		err = s.err
	}
	if err != nil || s.n <= 0 {
		if s.p != nil {
			putPipe(s.p)
			s.p = nil
		}
		return 0, err
	}
	s.p.data = s.n
	s.err = nil
	err = s.dst.Write(s.pump)
	if err == nil {
		err = s.err
	}
	moved := s.n - s.p.data
	putPipe(s.p)
	s.p = nil
	return moved, err
}

func (s *splicer) readFn(fd uintptr) bool {
	if s.p = getPipe(); s.p == nil {
		s.err = errNoPipe
		return true
	}
	for {
		m, err := unix.Splice(int(fd), nil, s.p.w, nil, pipeSize, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			// Not readable after all: wait without holding the pipe.
			pipePool.Put(s.p)
			s.p = nil
			return false
		}
		s.n, s.err = int(m), err
		return true
	}
}

func (s *splicer) pumpFn(fd uintptr) bool {
	for s.p.data > 0 {
		m, err := unix.Splice(s.p.r, nil, int(fd), nil, s.p.data, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return false // dst is full: wait until writable
		case err != nil:
			s.err = err
			return true
		}
		s.p.data -= int(m)
	}
	return true
}
