package forwarder

import (
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// How bytes move
//
// Each direction of a connection moves a chunk at a time: wait until the
// source is readable, take what it has, write all of it to the other side.
// A chunk goes one of two ways:
//
//   - Spliced: socket → pipe → socket with splice(2), never copied through
//     user space. Worth it for bulk transfers.
//   - Buffered: read(2) into a pooled 64 KiB buffer, write(2) it out. For
//     small messages (requests, responses) this costs the same two system
//     calls as splicing, needs no pipe, and copies little.
//
// A direction starts buffered and switches to splicing when a chunk fills
// the whole buffer (a bulk stream); it switches back after a few small
// spliced chunks, the way HAProxy's splice-auto does. Pipes and buffers are
// borrowed from pools only while a chunk is in flight, so idle connections
// hold neither. (*net.TCPConn).ReadFrom would instead pin a pipe — two file
// descriptors sized 1 MiB — for each direction of each connection for its
// whole life: 40,000 descriptors for 10,000 idle connections.
//
// This is the goroutine engine's copy. A chunk that empties the socket is
// followed by one more read that says EAGAIN before the direction waits: a
// third system call per small message. Go's poller keeps readiness only,
// and a FIN read together with the last bytes brings no new edge, so
// skipping the read would leave such a close unseen until the idle
// timeout (TestReplyThenCloseReachesClient). The event loop
// (relay_linux.go) skips it: it sees EPOLLRDHUP. The pipes and buffers
// below serve both engines.
//
// When no pipe can be had (the process is out of file descriptors, or
// maxPipes are alive) a chunk is buffered, so open connections keep
// flowing while accept backs off.
//
// A spliced chunk is at most 64 KiB (the pipe's size), as HAProxy's
// default pipes are. Measured in the bench (2026-11-26, svcproxy-vip
// against HAProxy in the same runs, 3–5 interleaved rounds, medians of the
// ratios): with 1 MiB pipes, 1 MiB transfers over 8 keep-alive connections
// reached 0.67–0.75× HAProxy's (eight runs, median 0.70), with 64 KiB
// pipes 0.76–1.11× (nine runs, median 0.85), with 32 KiB 0.61–0.67×; bulk
// on one and four streams did not change beyond the runs' noise (0.9–1.2×
// either way). A large chunk leaves hundreds of KiB queued unsent in the
// client's socket, sent later from softirq context on whichever CPU takes
// the client's ACKs or the pacing timer (this machine's congestion control
// is BBR, which paces): the segments of one connection leave from two CPUs
// and arrive reordered. svcproxy made 1,000–1,300 spurious fast
// retransmits per 3 s of that test against HAProxy's 60–260; with 64 KiB
// chunks, 150–450. With Reno, which does not pace, both proxies moved
// 3.1–3.4k transfers/s, the same, even with 1 MiB chunks.
//
// Asking a splice for more than the pipe's 64 KiB, as HAProxy does (it asks
// for 1 GiB), changes nothing on this kernel (6.18): do_splice_read cuts a
// splice from a socket to the pipe's free slots times the page size before
// it starts, so one splice into an empty 16-slot pipe moves 64 KiB at most
// however large the socket's fragments. Traced under a bulk stream
// (2026-11-28, perf, every splice's result over 2 s): 65,536 bytes at most,
// either way. An A/B of the two, 8 turns against HAProxy, had put them 8 %
// apart on 1 MiB transfers and bulk: the rig's noise between identical data
// paths.

const (
	pipeSize   = 64 << 10 // capacity asked of each pipe: the most one splice moves
	bufferSize = 64 << 10 // buffered chunks; a full one means a bulk stream
	smallChunk = 16 << 10 // a spliced chunk under this is small
	smallRun   = 4        // small spliced chunks in a row before buffering again
	maxPipes   = 1024     // pipes alive at once, at most
)

type pipe struct {
	r, w int
	data int // bytes in the pipe
}

var livePipes atomic.Int64

// pipePool holds idle, empty pipes. It has no New, so shedPipes can empty
// it.
var pipePool sync.Pool

func newPipe() *pipe {
	if livePipes.Add(1) > maxPipes {
		livePipes.Add(-1)
		return nil
	}
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		livePipes.Add(-1)
		return nil
	}
	// A smaller pipe still works, with more system calls.
	_, _ = unix.FcntlInt(uintptr(fds[0]), unix.F_SETPIPE_SZ, pipeSize)
	p := &pipe{r: fds[0], w: fds[1]}
	runtime.SetFinalizer(p, (*pipe).close)
	return p
}

func getPipe() *pipe {
	if p, ok := pipePool.Get().(*pipe); ok {
		return p
	}
	return newPipe()
}

// shedPipes closes every idle pooled pipe and returns how many file
// descriptors that freed: accept calls it when the process is out of
// them, as two descriptors per idle pipe are worth more as a connection.
func shedPipes() int {
	n := 0
	for {
		p, ok := pipePool.Get().(*pipe)
		if !ok {
			return n
		}
		runtime.SetFinalizer(p, nil)
		p.close()
		n += 2
	}
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
	livePipes.Add(-1)
}

var bufferPool = sync.Pool{New: func() any { b := make([]byte, bufferSize); return &b }}

// splicer moves one direction's chunks. Its callbacks are bound once, when
// the pooled conn is made, so a chunk costs no allocation.
type splicer struct {
	src, dst syscall.RawConn

	splicing bool // the direction looks like bulk: splice its chunks
	small    int  // small spliced chunks in a row

	p   *pipe   // a spliced chunk's pipe
	buf *[]byte // a buffered chunk's buffer
	n   int     // bytes taken from src in this chunk
	off int     // bytes of buf written
	err error   // the syscall error inside a callback

	read, pump, write func(fd uintptr) bool
}

func newSplicer() *splicer {
	s := &splicer{}
	s.read, s.pump, s.write = s.readFn, s.pumpFn, s.writeFn
	return s
}

// reset readies s for a new connection.
func (s *splicer) reset(src, dst syscall.RawConn) {
	s.src, s.dst = src, dst
	s.splicing, s.small = false, 0
}

// attach readies s to move src's bytes to dst.
func (s *splicer) attach(src, dst *net.TCPConn) error {
	srcRC, err := src.SyscallConn()
	if err != nil {
		return err
	}
	dstRC, err := dst.SyscallConn()
	if err != nil {
		return err
	}
	s.reset(srcRC, dstRC)
	return nil
}

// detach lets go of the connection's sockets.
func (s *splicer) detach() { s.reset(nil, nil) }

// chunk waits until src has bytes (or EOF, or its read deadline), then
// moves what it has to dst. It returns the bytes moved; 0 and a nil error
// mean EOF. When it fails after taking bytes from src, those bytes are
// lost, so the caller must end the connection on any error but a read
// deadline (which can only strike before any byte is taken).
func (s *splicer) chunk() (int, error) {
	s.p, s.buf, s.n, s.off, s.err = nil, nil, 0, 0, nil
	err := s.src.Read(s.read)
	if err == nil {
		err = s.err
	}
	if s.p != nil {
		return s.pumpPipe(err)
	}
	if s.buf != nil {
		return s.writeBuffer(err)
	}
	return 0, err
}

func (s *splicer) readFn(fd uintptr) bool {
	if s.splicing {
		if s.p = getPipe(); s.p != nil {
			return s.spliceIn(fd)
		}
	}
	return s.readIn(fd)
}

// spliceIn moves what the socket has into s.p.
func (s *splicer) spliceIn(fd uintptr) bool {
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
		s.n, s.err = max(int(m), 0), err
		return true
	}
}

// readIn reads what the socket has into a pooled buffer.
func (s *splicer) readIn(fd uintptr) bool {
	bp := bufferPool.Get().(*[]byte)
	for {
		n, err := unix.Read(int(fd), *bp)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			bufferPool.Put(bp)
			return false
		}
		s.buf, s.n, s.err = bp, max(n, 0), err
		return true
	}
}

// pumpPipe finishes a spliced chunk and decides whether to keep splicing.
func (s *splicer) pumpPipe(err error) (int, error) {
	defer func() { putPipe(s.p); s.p = nil }()
	if err != nil || s.n == 0 {
		return 0, err
	}
	s.p.data = s.n
	s.err = nil
	if err = s.dst.Write(s.pump); err == nil {
		err = s.err
	}
	if s.n < smallChunk {
		if s.small++; s.small >= smallRun {
			s.splicing, s.small = false, 0
		}
	} else {
		s.small = 0
	}
	return s.n - s.p.data, err
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

// writeBuffer finishes a buffered chunk; a full buffer turns splicing on.
func (s *splicer) writeBuffer(err error) (int, error) {
	defer func() { bufferPool.Put(s.buf); s.buf = nil }()
	if err != nil || s.n == 0 {
		return 0, err
	}
	s.err = nil
	if err = s.dst.Write(s.write); err == nil {
		err = s.err
	}
	if s.n == len(*s.buf) {
		s.splicing = true
	}
	return s.off, err
}

func (s *splicer) writeFn(fd uintptr) bool {
	for s.off < s.n {
		m, err := unix.Write(int(fd), (*s.buf)[s.off:s.n])
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return false // dst is full: wait until writable
		case err != nil:
			s.err = err
			return true
		}
		s.off += m
	}
	return true
}
