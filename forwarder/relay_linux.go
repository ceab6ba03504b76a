package forwarder

import (
	"errors"
	"net/netip"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/connlog"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/offload"
)

// The connection state machine
//
//	accepted ──route, admit──► dialling ──EPOLLOUT──► open ──both halves done──► closed
//	   │                        │  ▲ refused, reset, timeout:                ▲
//	   │                        │  └─ next backend (DialTimeouts bound it)   │ reset, idle,
//	   └─ no Service, no        └─ client left (EPOLLRDHUP, nothing to read)  │ drain, shutdown
//	      endpoints, limit ──────────────────────────────────────────────► rejected (RST)
//
// An open relay is two halves, client→backend (in) and backend→client
// (out). A half reads what its source has and writes it to its sink: a
// small message through the worker's one read buffer, a bulk stream with
// splice(2) through a pipe borrowed while bytes are in it. When the sink
// cannot take everything, the rest waits in a buffer borrowed for the
// purpose and the half stops reading its source until the sink drains
// (EPOLLOUT): an idle connection holds neither buffer nor pipe. A half
// whose source ends (a read of 0, or a short read after EPOLLRDHUP) shuts
// its sink's write side once its bytes are out: half-close passes through
// in both orders. The relay closes when both halves are done, or at once
// on an error, which it passes on as a reset.
//
// The relay relies on what it knows comes next to spare segments, each of
// which costs a transmit and a receive (on veth, both on the sender's CPU
// time):
//
//   - As it is accepted, the client is asked whether it has sent bytes
//     (clientSpoke: a one-byte MSG_PEEK; they stay in its socket, so a
//     dial that waits holds no buffer). Most clients speak first, and
//     theirs are there by then. When they are, the dial turns TCP_QUICKACK
//     off, so the handshake's last ACK waits for them and leaves in their
//     segment. Otherwise the dial is ordinary: a server that speaks first
//     must not wait for an ACK held for bytes that never come (the
//     kernel's bound is 200 ms).
//   - When a source's FIN came with its last bytes, they are written with
//     MSG_MORE, and the shutdown or close right after puts the FIN in
//     their segment instead of one of its own.
//
// Measured with a connection per request (wrk, 64 connections, 1 KiB
// responses, client, node and backend namespaces on veths): segments
// through the node per connection 19.0 → 18.0 (the FIN) → 17.3 (the ACK,
// 73 % of connections had their bytes in hand at accept); in 4 turns
// against the build before, 0.5–17 % more connections/s (median 8.6 %) at
// 1–16 % less CPU each (median 7 %).
//
// A spliced source that runs dry (EAGAIN after bytes) is told to send the
// ACK it holds back, at once (ackNow). Read by splice while more kept
// arriving, a socket does not acknowledge at the read, and a sender that
// then waits on that ACK, as at the end of every response, waits for the
// delayed-ACK timer: 20–40 ms. Measured in the same rig with 1 MiB
// responses over 8 keep-alive connections, 3 turns: 2,160–2,330
// transfers/s against 1,690–1,850 without (HAProxy 1,780–1,880), the p99
// 19–29 ms against 58 ms; one setsockopt per drain, and bulk streams
// unchanged within the rig's noise. Setting it after every splice instead
// cost bulk 5–15 % of its throughput.

type relayState uint8

const (
	relayDialling relayState = iota + 1
	relayOpen
	relayClosed
)

// maxFreeRelays bounds a worker's finished relays kept for reuse: enough
// for connection churn, not the peak of a spike.
const maxFreeRelays = 256

// turnBudget is how much one half reads before the worker's other
// connections get their turn: a bulk stream whose source never runs dry
// would otherwise hold its worker for as long as it flows.
const turnBudget = 1 << 20

// errDialTimeout is a connect attempt that took longer than its
// DialTimeouts entry.
var errDialTimeout = errors.New("connect timed out")

// side is one of a relay's sockets and what edge-triggered epoll last said
// of it.
type side struct {
	fd       int
	readable bool
	writable bool
	rdhup    bool // the peer's FIN is queued behind whatever is left to read
}

// half is one direction of a relay.
type half struct {
	p        *pipe   // spliced bytes not yet written
	buf      *[]byte // buffered bytes not yet written: (*buf)[off:n]
	off, n   int
	splicing bool // the direction looks like bulk
	unacked  bool // bytes spliced from the source since it last said EAGAIN
	small    int  // small spliced chunks in a row
	turn     int  // bytes read in this turn (see turnBudget)
	eof      bool // the source ended; shut the sink once the bytes are out
	done     bool // the sink was shut
	bytes    int64
}

// empty reports whether h holds no bytes taken from its source.
func (h *half) empty() bool {
	return (h.p == nil || h.p.data == 0) && (h.buf == nil || h.off >= h.n)
}

// relay is one forwarded TCP connection, owned by one worker.
type relay struct {
	w     *worker
	state relayState
	id    uint64
	idx   int // in w.relays

	client, up side
	in, out    half

	pool     *lb.Pool
	backend  *lb.Backend // the one dialled, then the one connected
	tried    lb.Tried
	attempt  int   // attempts started
	dialFrom int64 // monotime the current attempt started
	spoke    bool  // the client had sent bytes when accepted (clientSpoke)
	clientIP netip.Addr

	reason   closeReason
	draining bool
	queued   bool  // in the worker's later list
	noted    bool  // in the worker's batch, to be pumped after the harvest
	last     int64 // monotime bytes last moved
	opened   int64 // monotime the backend connection opened

	dialT, idleT, drainT, keepT timer
	firstT                      timer // the Service's FirstByteTimeout, from the client's first bytes delivered
	answered                    bool  // the backend has sent something (or ended its side)

	rec connlog.Record

	// Kernel offload (offload_linux.go).
	off      offload.Pair
	offOn    bool      // off is in the engine's offloader
	offDone  bool      // insertion was tried or given up: never again
	offBase  [2]uint64 // bytes written into the backend (in) and client (out) sockets at insertion
	offUser  [2]int64  // in.bytes and out.bytes at insertion
	offSeen  uint64    // the kernel's count at the last idle check
	offWait  int64     // monotime a half waiting for its FIN last saw progress
	offProg  uint64    // what its sink had written then
	offPolls uint8     // its looks so far (see offloadPoll)
	offT     timer
}

// newRelay takes a finished relay for reuse, or makes one.
func (w *worker) newRelay() *relay {
	var r *relay
	if n := len(w.free); n > 0 {
		r = w.free[n-1]
		w.free[n-1] = nil
		w.free = w.free[:n-1]
	} else {
		r = &relay{w: w}
		r.dialT = timer{idx: -1, kind: timerDial, c: r}
		r.idleT = timer{idx: -1, kind: timerIdle, c: r}
		r.drainT = timer{idx: -1, kind: timerDrain, c: r}
		r.keepT = timer{idx: -1, kind: timerKeepalive, c: r}
		r.firstT = timer{idx: -1, kind: timerFirstByte, c: r}
		r.offT = timer{idx: -1, kind: timerOffload, c: r}
	}
	r.idx = len(w.relays)
	w.relays = append(w.relays, r)
	w.conns.Add(1)
	return r
}

// open takes a connection just accepted on ln: it reads where the client
// was going, then serves it here or hands it to a less loaded worker.
func (w *worker) open(ln *loopListener, fd int) {
	// Counted from here, so that Shutdown also waits for a connection
	// that is on its way to another worker.
	w.f.handlers.Add(1)
	client := rawAddrPort(&w.rsa)
	dst := ln.local
	switch {
	case ln.redirect:
		var err error
		if dst, err = getOriginalDst(fd); err != nil {
			dst, _ = sockName(fd)
		}
	case dst.Addr().IsUnspecified(): // a NodePort on every address
		dst, _ = sockName(fd)
	}
	a := adoption{fd: fd, id: w.f.nextID.Add(1), start: time.Now(), client: client, dst: netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())}
	if o := w.e.lighter(w); o != nil && o.adopt(a) {
		w.f.m.Rebalanced.Inc()
		return
	}
	w.serve(a)
}

// serve finds the Service of a connection accepted by this worker or
// handed to it (and counted in handlers by open), admits it and starts
// dialling.
func (w *worker) serve(a adoption) {
	f := w.f
	r := w.newRelay()
	r.state = relayDialling
	r.id = a.id
	fd, client, dst, start := a.fd, a.client, a.dst, a.start
	r.client = side{fd: fd, writable: true}
	r.up = side{fd: -1}
	r.rec = connlog.Record{Start: start, ID: r.id, Protocol: "TCP"}
	r.clientIP = client.Addr()
	r.rec.Client, r.rec.Frontend = client, dst

	pool := f.route(lb.TCP, r.clientIP, dst)
	if pool == nil {
		f.m.connNoService.Inc()
		r.reject("no_service")
		return
	}
	r.pool = pool
	r.rec.Service = pool.Service.Name.String()
	if len(pool.Backends()) == 0 {
		f.m.connNoEndpoints.Inc()
		r.reject("no_endpoints")
		return
	}
	if !f.admit(pool) {
		f.m.connLimit.Inc()
		r.pool = nil
		r.reject("limit")
		return
	}
	r.spoke = clientSpoke(fd, w.buf)
	if err := w.register(fd, fdEntry{r: r}, unix.EPOLLIN|unix.EPOLLOUT|unix.EPOLLRDHUP|unix.EPOLLET); err != nil {
		w.log.Warn("cannot watch a client connection", zap.Error(err))
		f.unadmit(pool)
		f.m.connDialFailed.Inc()
		r.reject("dial_failed")
		return
	}
	r.dial(start)
}

// dial starts the next attempt, each to a backend not tried yet, until one
// starts or there is none left; then the relay is rejected.
func (r *relay) dial(now time.Time) {
	w, f := r.w, r.w.f
	for r.attempt < len(f.cfg.DialTimeouts) {
		b := r.pool.Pick(r.clientIP, &r.tried, now)
		if b == nil {
			break
		}
		r.tried.Add(b)
		if r.attempt > 0 {
			f.m.DialRetries.Inc()
		}
		timeout := f.cfg.DialTimeouts[r.attempt]
		r.attempt++
		r.backend = b
		r.dialFrom = monotime()
		// When the client has spoken, the handshake's last ACK waits
		// for its bytes (TCP_QUICKACK off until connected), which leave
		// as soon as the connect completes: one segment less. Never
		// otherwise: a server that speaks first would wait for that ACK
		// up to the kernel's 200 ms delayed-ACK bound.
		fd, err := connectSocket(b.Addr, f.cfg.Mark, r.spoke, &w.sa4, &w.sa6)
		if isFDLimit(err) && shedPipes() > 0 { // idle splice pipes hold descriptors
			fd, err = connectSocket(b.Addr, f.cfg.Mark, r.spoke, &w.sa4, &w.sa6)
		}
		if err == nil {
			if err = w.register(fd, fdEntry{r: r, upstream: true}, unix.EPOLLIN|unix.EPOLLOUT|unix.EPOLLRDHUP|unix.EPOLLET); err != nil {
				unix.Close(fd)
			}
		}
		if err != nil {
			if isLocalDialError(err) {
				// This host is out of descriptors or ports: every backend
				// would fail alike, and none of them is to blame. The
				// client is reset at once, as the next ones will be
				// (by this path, or by accept's spare descriptor), so
				// none waits in the accept queue for a slot.
				f.m.dialError.Inc()
				r.noteAttempt(err)
				w.log.Debug("cannot open a backend connection", zap.Stringer("backend", b.Addr), zap.Error(err))
				break
			}
			r.attemptFailed(err, false)
			now = time.Now()
			continue
		}
		r.up = side{fd: fd}
		w.timers.set(&r.dialT, r.dialFrom+int64(timeout))
		return
	}
	f.unadmit(r.pool)
	f.m.connDialFailed.Inc()
	r.reject("dial_failed")
}

// noteAttempt records the current attempt in the connection log record.
func (r *relay) noteAttempt(err error) {
	if r.rec.NAttempts < len(r.rec.Attempts) {
		r.rec.Attempts[r.rec.NAttempts] = connlog.Attempt{Backend: r.backend.Addr,
			Latency: time.Duration(monotime() - r.dialFrom), Err: err}
		r.rec.NAttempts++
	}
}

// attemptFailed ends the current attempt (registered: its socket is open)
// and counts it against its backend.
func (r *relay) attemptFailed(err error, registered bool) {
	w, f := r.w, r.w.f
	if registered {
		w.timers.stop(&r.dialT)
		w.closeFD(r.up.fd)
		r.up.fd = -1
	}
	r.noteAttempt(err)
	switch {
	case isRefused(err):
		f.m.dialRefused.Inc()
	case err == errDialTimeout:
		f.m.dialTimeout.Inc()
	default:
		f.m.dialError.Inc()
		w.log.Debug("backend dial failed", zap.Stringer("backend", r.backend.Addr), zap.Error(err))
	}
	r.backend.ReportFailure(time.Now())
}

func (r *relay) dialTimedOut() {
	r.attemptFailed(errDialTimeout, true)
	r.dial(time.Now())
}

// event handles an epoll event on one of r's sockets.
func (r *relay) event(upstream bool, ev uint32) {
	s := &r.client
	if upstream {
		s = &r.up
	}
	if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		s.readable = true
	}
	if ev&(unix.EPOLLOUT|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		s.writable = true
	}
	if ev&unix.EPOLLRDHUP != 0 {
		s.rdhup = true
	}
	if r.state == relayDialling {
		r.dialEvent(upstream, ev)
		return
	}
	if r.w.batch != nil {
		r.w.note(r)
		return
	}
	r.pump()
}

func (r *relay) dialEvent(upstream bool, ev uint32) {
	if !upstream {
		// The client may send before the backend answers; that waits. But
		// a client that left cancels the dial: one that reset (EPOLLERR,
		// EPOLLHUP: its bytes still in the socket would make a peek say
		// otherwise), or sent its FIN with nothing before it. A FIN after
		// bytes is a half-close, for the backend to see.
		gone := ev&(unix.EPOLLHUP|unix.EPOLLERR) != 0
		if !gone && ev&unix.EPOLLRDHUP != 0 {
			gone = peerGone(r.client.fd)
		}
		if gone {
			w, f := r.w, r.w.f
			w.timers.stop(&r.dialT)
			w.closeFD(r.up.fd)
			r.up.fd = -1
			f.unadmit(r.pool)
			f.m.connClientGone.Inc()
			r.reject("client_gone")
		}
		return
	}
	switch {
	case ev&(unix.EPOLLERR|unix.EPOLLHUP) != 0:
		err := soError(r.up.fd)
		if err == nil {
			err = unix.ECONNRESET
		}
		r.attemptFailed(err, true)
		r.dial(time.Now())
	case ev&unix.EPOLLOUT != 0:
		r.connected()
	}
}

// connected moves a relay whose connect completed to open.
func (r *relay) connected() {
	w, f := r.w, r.w.f
	w.timers.stop(&r.dialT)
	b := r.backend
	lat := time.Duration(monotime() - r.dialFrom)
	f.m.dialOK.Inc()
	f.m.ConnectLatency.Observe(lat.Seconds())
	if r.pool.Service.FirstByteTimeout == 0 { // else the backend's first bytes are its success
		b.ReportSuccess()
	}
	r.noteAttempt(nil)
	f.m.connOK.Inc()
	r.rec.Backend = b.Addr
	b.Acquire()
	f.m.activeTCP.Inc()
	r.state = relayOpen
	if hook := testHookAdded.Load(); hook != nil {
		(*hook)()
	}
	// Drain passes skip dialling relays: a snapshot that dropped the
	// endpoint meanwhile is caught here, and the relay drains like every
	// other connection to it (failing it would fail a client that did
	// nothing wrong).
	if !f.snap.Load().HasEndpoint(r.pool.Service.Name, b.Addr) {
		r.startDrain()
	}
	r.last, r.opened = w.now, w.now
	if idle := f.cfg.IdleTimeout; idle > 0 {
		w.timers.set(&r.idleT, w.now+int64(idle))
	}
	if w.e.upstreamOpts != nil {
		w.timers.set(&r.keepT, w.now+int64(f.cfg.KeepAlive))
	}
	r.pump()
}

// keepalive turns TCP keepalive on for the backend socket of a relay that
// has lived KeepAlive. A younger connection cannot be due a probe yet, and
// most never get this old: three setsockopt calls fewer per connection.
// The first probe of an idle connection comes between one and two
// KeepAlive periods after its last bytes instead of after one.
func (r *relay) keepalive() {
	for _, o := range r.w.e.upstreamOpts {
		if err := sysSetsockoptInt(r.up.fd, o.level, o.name, o.value); err != nil {
			r.w.log.Debug("cannot turn keepalive on for a backend connection", zap.String("option", o.what), zap.Error(err))
			return
		}
	}
}

// pump moves what both halves can move now.
func (r *relay) pump() {
	if !r.flow(&r.in, &r.client, &r.up) {
		return
	}
	if !r.flow(&r.out, &r.up, &r.client) {
		return
	}
	if !r.answered && r.pool.Service.FirstByteTimeout > 0 {
		r.firstByte() // before a finish: an answer that came with the end counts
	}
	if r.in.done && r.out.done {
		r.finish()
		return
	}
	if !r.offDone && r.w.e.off != nil {
		r.maybeOffload()
	}
}

// firstByte arms the first-byte timer once the client's first bytes have
// reached the backend, and ends it for good once the backend has sent
// something or ended its side.
func (r *relay) firstByte() {
	out := &r.out
	if out.bytes > 0 || out.eof || !out.empty() {
		r.answered = true
		r.w.timers.stop(&r.firstT)
		r.backend.ReportSuccess()
		return
	}
	if r.in.bytes > 0 && !r.firstT.armed() {
		r.w.timers.set(&r.firstT, r.w.now+int64(r.pool.Service.FirstByteTimeout))
	}
}

// firstByteTimedOut fails a connection whose backend sent nothing within
// the Service's FirstByteTimeout of receiving the client's first bytes:
// the backend is charged a failure (passive health), both sides are reset.
func (r *relay) firstByteTimedOut() {
	if r.state != relayOpen || r.answered {
		return
	}
	r.firstByte() // bytes may have come with no event yet handled
	if r.answered {
		return
	}
	r.backend.ReportFailure(time.Now())
	linger0(r.client.fd)
	linger0(r.up.fd)
	r.kill(reasonFirstByte)
}

// flow moves h's bytes from src to dst until one of them would block. It
// returns false when the relay ended.
func (r *relay) flow(h *half, src, dst *side) bool {
	for {
		// Bytes already taken from src go first.
		if empty, alive := r.flushHeld(h, dst); !alive || !empty {
			return alive
		}
		if h.done {
			return true
		}
		if h.eof {
			if r.offOn && !r.offloadFlushed(h, dst) {
				return true // the kernel's bytes first
			}
			r.passEOF(h, dst)
			return true
		}
		if !src.readable {
			return true
		}
		if h.turn >= turnBudget {
			// Enough for one turn: the worker's other connections go
			// first, and this one is pumped again before the loop waits.
			h.turn = 0
			r.w.later(r)
			return true
		}
		if h.splicing {
			if p := getPipe(); p != nil {
				if !r.spliceIn(h, p, src) {
					return false
				}
				if !src.readable && h.p == nil {
					return true
				}
				continue
			}
		}
		if !r.readIn(h, src, dst) {
			return false
		}
	}
}

// passEOF gives dst, h's sink, its FIN once h's source has ended and
// every byte is out: by shutdown while the other direction still flows,
// by the close that follows at once when it is done too (its source is
// drained, so close sends a FIN, not a reset).
func (r *relay) passEOF(h *half, dst *side) {
	if other := r.other(h); !other.done {
		sysShutdownWrite(dst.fd)
	}
	h.done = true
	if h == &r.in {
		r.setReason(reasonClientEOF)
	} else {
		r.setReason(reasonBackendEOF)
	}
}

// flushHeld writes the bytes h holds (in its pipe or its buffer) to dst,
// and returns the pipe or buffer once empty. It reports whether h holds
// nothing now, and false for alive when the relay ended.
func (r *relay) flushHeld(h *half, dst *side) (empty, alive bool) {
	for {
		var m int
		var err error
		switch {
		case h.p != nil && h.p.data > 0:
			m, err = sysSplice(h.p.r, dst.fd, h.p.data)
		case h.buf != nil && h.off < h.n:
			m, err = r.write(h, dst, (*h.buf)[h.off:h.n])
		default:
			if h.p != nil {
				putPipe(h.p)
				h.p = nil
			}
			if h.buf != nil {
				bufferPool.Put(h.buf)
				h.buf = nil
			}
			return true, true
		}
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			dst.writable = false
			return false, true
		case err != nil:
			r.fail(h, err)
			return false, false
		}
		if h.p != nil {
			h.p.data -= m
		} else {
			h.off += m
		}
		h.bytes += int64(m)
	}
}

func (r *relay) other(h *half) *half {
	if h == &r.in {
		return &r.out
	}
	return &r.in
}

// spliceIn moves what src has into p, which becomes h's pipe.
func (r *relay) spliceIn(h *half, p *pipe, src *side) bool {
	for {
		m, err := sysSplice(src.fd, p.w, pipeSize)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			src.readable = false
			putPipe(p)
			if h.unacked {
				h.unacked = false
				ackNow(src.fd)
			}
			return true
		case err != nil:
			putPipe(p)
			r.fail(h, err)
			return false
		case m == 0:
			putPipe(p)
			h.eof = true
			return true
		}
		// A short splice says nothing of what is left (the pipe may be out
		// of slots), so src stays readable until it says EAGAIN.
		r.last = r.w.now
		h.turn += m
		p.data = m
		h.p = p
		h.unacked = true
		if m < smallChunk {
			if h.small++; h.small >= smallRun {
				h.splicing, h.small = false, 0
			}
		} else {
			h.small = 0
		}
		return true
	}
}

// readIn reads a chunk from src into the worker's buffer and writes it to
// dst; what dst does not take waits in a borrowed buffer.
func (r *relay) readIn(h *half, src, dst *side) bool {
	buf := r.w.buf
	var n int
	for {
		var err error
		n, err = sysRead(src.fd, buf)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			src.readable = false
			return true
		case err != nil:
			r.fail(h, err)
			return false
		}
		break
	}
	if n == 0 {
		h.eof = true
		return true
	}
	if !r.took(h, src, n, len(buf)) {
		h.splicing = true // a full buffer: a bulk stream
	}
	_, alive := r.send(h, dst, buf[:n])
	return alive
}

// took accounts n bytes just read from src into a buffer of size for h,
// and reports whether they emptied the socket (a short read). With src's
// FIN already queued they were the last of it: h ends with them, and no
// read is spent to see EOF.
func (r *relay) took(h *half, src *side, n, size int) (emptied bool) {
	r.last = r.w.now
	h.turn += n
	if n == size {
		return false
	}
	src.readable = false
	if src.rdhup {
		h.eof = true
	}
	return true
}

// send writes p, bytes taken from h's source, to dst; what dst does not
// take waits in a borrowed buffer. It reports whether all of p went, and
// false for alive when the relay ended.
func (r *relay) send(h *half, dst *side, p []byte) (sent, alive bool) {
	for len(p) > 0 {
		m, err := r.write(h, dst, p)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			dst.writable = false
			r.hold(h, p)
			return false, true
		case err != nil:
			r.fail(h, err)
			return false, false
		}
		p = p[m:]
		h.bytes += int64(m)
	}
	return true, true
}

// write writes p, h's bytes, to dst. When h's source has ended they are
// its last, and passEOF sends the FIN right after (flow, batchRead): they
// go with MSG_MORE so that the FIN leaves in the same segment. Not while
// offloaded bytes may still be in the kernel: the FIN waits for those.
func (r *relay) write(h *half, dst *side, p []byte) (int, error) {
	if h.eof && !r.offOn {
		return sysWriteLast(dst.fd, p)
	}
	return sysWrite(dst.fd, p)
}

// hold keeps p, bytes of h its sink did not take, in a borrowed buffer.
func (r *relay) hold(h *half, p []byte) {
	bp := bufferPool.Get().(*[]byte)
	h.n = copy(*bp, p)
	h.buf, h.off = bp, 0
}

// setReason records why the relay ends (see closeReason.replaces); it
// reports whether reason is now the one.
func (r *relay) setReason(reason closeReason) bool {
	if !reason.replaces(r.reason) {
		return false
	}
	r.reason = reason
	return true
}

// fail ends the relay after an error moving h's bytes, passing a reset on.
func (r *relay) fail(h *half, err error) {
	reason := reasonBackendReset
	if h == &r.in {
		reason = reasonClientReset
	}
	if r.setReason(reason) {
		linger0(r.client.fd)
		linger0(r.up.fd)
	}
	r.finish()
}

func linger0(fd int) {
	_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
}

// kill ends the relay for reason (idle, drain, shutdown).
func (r *relay) kill(reason closeReason) {
	switch r.state {
	case relayOpen:
		r.setReason(reason)
		r.finish()
	case relayDialling:
		w, f := r.w, r.w.f
		w.timers.stop(&r.dialT)
		w.closeFD(r.up.fd)
		r.up.fd = -1
		f.unadmit(r.pool)
		r.reject(closeReasons[reason])
	}
}

func (r *relay) idleCheck() {
	idle := int64(r.w.f.cfg.IdleTimeout)
	if r.offOn && r.offloadActive() {
		r.last = r.w.now
	}
	if until := r.last + idle; until > r.w.now {
		r.w.timers.set(&r.idleT, until)
		return
	}
	r.kill(reasonIdle)
}

// startDrain marks r as a connection to an endpoint that left its Service:
// it goes on until DrainTimeout, then is closed unless the endpoint came
// back.
func (r *relay) startDrain() {
	if r.draining {
		return
	}
	r.draining = true
	r.w.f.m.Draining.Inc()
	r.w.timers.set(&r.drainT, r.w.now+int64(r.w.f.cfg.DrainTimeout))
}

func (r *relay) drainCheck() {
	if !r.w.f.snap.Load().HasEndpoint(r.pool.Service.Name, r.backend.Addr) {
		r.kill(reasonDrain)
		return
	}
	// The endpoint came back: the relay no longer drains, and a later
	// removal drains it anew.
	r.draining = false
	r.w.f.m.Draining.Dec()
}

// finish closes an open relay and accounts for it.
func (r *relay) finish() {
	w, f := r.w, r.w.f
	w.timers.stop(&r.idleT)
	w.timers.stop(&r.drainT)
	w.timers.stop(&r.keepT)
	w.timers.stop(&r.firstT)
	w.timers.stop(&r.offT)
	if r.offOn {
		r.offloadEnd()
	}
	w.closeFD(r.client.fd)
	w.closeFD(r.up.fd)
	for _, h := range []*half{&r.in, &r.out} {
		if h.p != nil {
			putPipe(h.p)
		}
		if h.buf != nil {
			bufferPool.Put(h.buf)
		}
	}
	if r.draining {
		f.m.Draining.Dec()
	}
	r.rec.BytesIn, r.rec.BytesOut = r.in.bytes, r.out.bytes
	r.rec.CloseReason = closeReasons[r.reason]
	r.rec.Duration = time.Since(r.rec.Start)
	f.m.bytesIn.Add(float64(r.in.bytes))
	f.m.bytesOut.Add(float64(r.out.bytes))
	f.m.closes[r.reason].Inc()
	if f.cfg.ConnLog.Sampled(r.id) {
		f.cfg.ConnLog.Log(&r.rec)
	}
	f.m.activeTCP.Dec()
	r.backend.Release()
	f.unadmit(r.pool)
	r.release()
}

// reject resets the client: a prompt RST, never a hang. The caller has
// undone admission.
func (r *relay) reject(why string) {
	linger0(r.client.fd)
	r.w.closeFD(r.client.fd)
	r.rec.Failed = true
	r.rec.CloseReason = why
	r.rec.Duration = time.Since(r.rec.Start)
	r.w.f.cfg.ConnLog.Log(&r.rec)
	r.release()
}

// release returns r to its worker's free list.
func (r *relay) release() {
	w := r.w
	last := len(w.relays) - 1
	if r.idx != last {
		moved := w.relays[last]
		w.relays[r.idx] = moved
		moved.idx = r.idx
	}
	w.relays[last] = nil
	w.relays = w.relays[:last]
	w.conns.Add(-1)
	w.timers.stop(&r.dialT)
	*r = relay{w: w, dialT: r.dialT, idleT: r.idleT, drainT: r.drainT, keepT: r.keepT, firstT: r.firstT, offT: r.offT, idx: -1}
	if len(w.free) < maxFreeRelays { // past a spike, the rest is garbage to return
		w.free = append(w.free, r)
	}
	w.f.handlers.Done()
}
