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

// spliceChunk waits until src has bytes (or EOF, or its read deadline), then
// moves what it has, up to pipeSize, to dst through a pipe, without copying
// through user space. It returns the bytes moved; 0 and a nil error mean
// EOF. When it fails after moving bytes out of src, those bytes are lost,
// so the caller must end the connection on any error but a read deadline
// (which can only strike before any byte is taken).
func spliceChunk(dst, src syscall.RawConn) (int, error) {
	var p *pipe
	var n int
	var serr error
	err := src.Read(func(fd uintptr) bool {
		if p = getPipe(); p == nil {
			serr = errNoPipe
			return true
		}
		for {
			var m int64
			m, serr = unix.Splice(int(fd), nil, p.w, nil, pipeSize, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
			n = int(m)
			if serr != unix.EINTR {
				break
			}
		}
		if serr == unix.EAGAIN {
			// Not readable after all: wait without holding the pipe.
			pipePool.Put(p)
			p = nil
			return false
		}
		return true
	})
	if err == nil {
		err = serr
	}
	if err != nil || n <= 0 {
		if p != nil {
			putPipe(p)
		}
		return 0, err
	}
	p.data = n
	var werr error
	err = dst.Write(func(fd uintptr) bool {
		for p.data > 0 {
			m, e := unix.Splice(p.r, nil, int(fd), nil, p.data, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
			switch {
			case e == unix.EINTR:
				continue
			case e == unix.EAGAIN:
				return false // dst is full: wait until writable
			case e != nil:
				werr = e
				return true
			}
			p.data -= int(m)
		}
		return true
	})
	if err == nil {
		err = werr
	}
	moved := n - p.data
	putPipe(p)
	return moved, err
}
