package forwarder

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/connlog"
	"github.com/svcproxy/svcproxy/lb"
)

// closeReason says why a forwarded connection ended: the first event that
// ends it, except that one direction's end (client_eof, backend_eof) gives
// way to what then ends the other abnormally (see replaces).
type closeReason uint32

const (
	reasonNone closeReason = iota
	reasonClientEOF
	reasonBackendEOF
	reasonClientReset  // an error in the client-to-backend copy (a reset, mostly)
	reasonBackendReset // an error in the backend-to-client copy
	reasonIdle
	reasonDrain
	reasonShutdown
	reasonFirstByte // the backend sent nothing within the Service's FirstByteTimeout
)

// final reports whether r ends the connection for good: anything but none
// or one direction's end, after which the other direction still runs.
func (r closeReason) final() bool {
	return r != reasonNone && r != reasonClientEOF && r != reasonBackendEOF
}

// replaces reports whether r is recorded over cur: over none, and over one
// direction's end when r is final. A reset of the direction still running
// is then passed on as a reset, not left to look like a clean end, and an
// idle timeout or drain of a half-closed connection is named as such.
func (r closeReason) replaces(cur closeReason) bool {
	return cur == reasonNone || (!cur.final() && r.final())
}

// closeReasons are the connection-log and metric names of the reasons.
var closeReasons = [...]string{"", "client_eof", "backend_eof", "client_reset", "backend_reset", "idle_timeout", "drain", "shutdown", "first_byte_timeout"}

// clientWatchDelay is how long a backend dial may take before the forwarder
// starts watching the client, so it can give up if the client leaves.
const clientWatchDelay = 20 * time.Millisecond

// conn is one forwarded TCP connection. conns are pooled: gen changes each
// time one is reused, and timers check it before acting.
type conn struct {
	f *Forwarder
	e *goEngine

	mu       sync.Mutex // guards gen and finished against kill
	gen      uint64
	finished bool

	id       uint64
	client   *net.TCPConn
	upstream *net.TCPConn
	pool     *lb.Pool
	backend  *lb.Backend

	reason     atomic.Uint32 // closeReason; set once
	draining   atomic.Bool
	drainTimer *time.Timer

	in, out         *splicer     // client → backend, backend → client
	lastIn, lastOut atomic.Int64 // unix nanoseconds of the last bytes moved
	firstIn         atomic.Int64 // unix nanoseconds the client's first bytes reached the backend
	bytesIn         int64        // client → backend; written by the serving goroutine
	bytesOut        int64        // backend → client; written by the copy goroutine
	running         atomic.Int32 // copy goroutines still running

	dialCancel context.CancelFunc
	watchTimer *time.Timer
	watchDone  chan struct{}

	rec connlog.Record
}

// testHookAdded, set only by tests, runs as a new connection joins the open
// set, before it is checked against the snapshot once more.
var testHookAdded atomic.Pointer[func()]

var connPool = sync.Pool{New: func() any {
	c := &conn{watchDone: make(chan struct{}, 1), in: newSplicer(), out: newSplicer()}
	c.watchTimer = time.AfterFunc(time.Hour, c.watchClient)
	c.watchTimer.Stop()
	return c
}}

// serve handles one accepted connection on its own goroutine: it finds the
// Service, dials a backend and starts the two copy goroutines, which finish
// the connection; serve itself returns then, so the deep stack the dial
// needed is not kept for the connection's life.
func (e *goEngine) serve(client *net.TCPConn, redirect bool) {
	f := e.f
	c := connPool.Get().(*conn)
	c.f, c.e, c.client, c.id = f, e, client, f.nextID.Add(1)
	c.rec = connlog.Record{Start: time.Now(), ID: c.id, Protocol: "TCP"}
	if c.open(redirect) {
		return
	}
	c.release()
	f.handlers.Done()
}

// open routes, admits and connects c and starts its copies; false means c
// was rejected (and the client reset).
func (c *conn) open(redirect bool) bool {
	f, client := c.f, c.client
	clientAddr := client.RemoteAddr().(*net.TCPAddr).AddrPort()
	dst := client.LocalAddr().(*net.TCPAddr).AddrPort()
	if redirect {
		if od, err := originalDst(client); err == nil {
			dst = od
		}
	}
	clientAddr = netip.AddrPortFrom(clientAddr.Addr().Unmap(), clientAddr.Port())
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	c.rec.Client, c.rec.Frontend = clientAddr, dst

	pool := f.route(lb.TCP, clientAddr.Addr(), dst)
	if pool == nil {
		f.m.connNoService.Inc()
		c.reject("no_service")
		return false
	}
	c.pool = pool
	c.rec.Service = pool.Service.Name.String()
	if len(pool.Backends()) == 0 {
		f.m.connNoEndpoints.Inc()
		c.reject("no_endpoints")
		return false
	}
	if !f.admit(pool) {
		f.m.connLimit.Inc()
		c.reject("limit")
		return false
	}
	upstream, backend, gone := c.connect(clientAddr.Addr(), c.rec.Start)
	if upstream == nil {
		f.unadmit(pool)
		if gone {
			f.m.connClientGone.Inc()
			c.reject("client_gone")
		} else {
			f.m.connDialFailed.Inc()
			c.reject("dial_failed")
		}
		return false
	}
	f.m.connOK.Inc()
	c.upstream, c.backend = upstream, backend
	c.rec.Backend = backend.Addr
	backend.Acquire()
	f.m.activeTCP.Inc()

	c.e.conns.add(c)
	if hook := testHookAdded.Load(); hook != nil {
		(*hook)()
	}
	// A snapshot applied between Route and add has not seen c: check once.
	// Its endpoint left while it was being dialled; it drains like every
	// other connection to that endpoint (closing it here would fail a
	// client that did nothing wrong).
	if !f.snap.Load().HasEndpoint(pool.Service.Name, backend.Addr) {
		c.e.drainConn(c)
	}
	now := time.Now().UnixNano()
	c.lastIn.Store(now)
	c.lastOut.Store(now)
	c.running.Store(2)
	go c.copyIn()
	go c.copyOut()
	return true
}

func (c *conn) copyIn() {
	c.ended(c.copy(c.in, c.upstream, c.client, &c.lastIn, &c.lastOut, &c.bytesIn), true)
	c.copied()
}

func (c *conn) copyOut() {
	c.ended(c.copy(c.out, c.client, c.upstream, &c.lastOut, &c.lastIn, &c.bytesOut), false)
	c.copied()
}

// copied is called as each direction ends; the last one finishes c.
func (c *conn) copied() {
	if c.running.Add(-1) != 0 {
		return
	}
	f := c.f
	c.mu.Lock()
	c.finished = true
	if c.drainTimer != nil {
		c.drainTimer.Stop()
		c.drainTimer = nil
	}
	c.mu.Unlock()
	if c.draining.Load() {
		f.m.Draining.Dec()
	}
	_ = c.client.Close()
	_ = c.upstream.Close()
	c.e.conns.remove(c)

	reason := c.reason.Load()
	c.rec.BytesIn, c.rec.BytesOut = c.bytesIn, c.bytesOut
	c.rec.CloseReason = closeReasons[reason]
	c.rec.Duration = time.Since(c.rec.Start)
	f.m.bytesIn.Add(float64(c.bytesIn))
	f.m.bytesOut.Add(float64(c.bytesOut))
	f.m.closes[reason].Inc()
	if f.cfg.ConnLog.Sampled(c.id) {
		f.cfg.ConnLog.Log(&c.rec)
	}
	f.m.activeTCP.Dec()
	c.backend.Release()
	f.unadmit(c.pool)
	c.release()
	f.handlers.Done()
}

// admit counts c against the global and per-service caps.
func (f *Forwarder) admit(pool *lb.Pool) bool {
	if n := f.active.Add(1); f.cfg.MaxConns > 0 && n > f.cfg.MaxConns {
		f.active.Add(-1)
		return false
	}
	if n := pool.Conns().Add(1); f.cfg.MaxConnsPerService > 0 && n > f.cfg.MaxConnsPerService {
		pool.Conns().Add(-1)
		f.active.Add(-1)
		return false
	}
	return true
}

// unadmit undoes admit.
func (f *Forwarder) unadmit(pool *lb.Pool) {
	pool.Conns().Add(-1)
	f.active.Add(-1)
}

// logRefused counts and logs a client reset as soon as accepted because
// the process was out of descriptors.
func (f *Forwarder) logRefused(client, frontend netip.AddrPort) {
	f.m.connFDLimit.Inc()
	rec := connlog.Record{Start: time.Now(), ID: f.nextID.Add(1), Protocol: "TCP", Failed: true, CloseReason: resultFDLimit,
		Client:   netip.AddrPortFrom(client.Addr().Unmap(), client.Port()),
		Frontend: netip.AddrPortFrom(frontend.Addr().Unmap(), frontend.Port())}
	f.cfg.ConnLog.Log(&rec)
	now, last := time.Now().UnixNano(), f.refusedLogged.Load()
	if (last == 0 || now-last > int64(10*time.Second)) && f.refusedLogged.CompareAndSwap(last, now) {
		f.log.Warn("out of file descriptors: refusing new connections at once (the spare descriptor resets them)",
			zap.Stringer("frontend", rec.Frontend))
	}
}

// reject resets the client connection: a prompt RST, never a hang.
func (c *conn) reject(why string) {
	_ = c.client.SetLinger(0)
	_ = c.client.Close()
	c.rec.Failed = true
	c.rec.CloseReason = why
	c.rec.Duration = time.Since(c.rec.Start)
	c.f.cfg.ConnLog.Log(&c.rec)
}

// connect dials backends of c.pool for a client at clientIP, each attempt to
// a different backend with the next of DialTimeouts, until one accepts. It
// gives up early, reporting gone, if the client leaves while it dials.
func (c *conn) connect(clientIP netip.Addr, now time.Time) (up *net.TCPConn, b *lb.Backend, gone bool) {
	f := c.f
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.dialCancel = cancel
	c.watchTimer.Reset(clientWatchDelay)
	defer c.stopWatch()

	var tried lb.Tried
	for i, timeout := range f.cfg.DialTimeouts {
		b = c.pool.Pick(clientIP, &tried, now)
		if b == nil {
			break
		}
		tried.Add(b)
		if i > 0 {
			f.m.DialRetries.Inc()
		}
		t0 := time.Now()
		actx, acancel := context.WithTimeout(ctx, timeout)
		nc, err := f.dialer.DialContext(actx, "tcp", b.Dial)
		acancel()
		lat := time.Since(t0)
		if c.rec.NAttempts < len(c.rec.Attempts) {
			c.rec.Attempts[c.rec.NAttempts] = connlog.Attempt{Backend: b.Addr, Latency: lat, Err: err}
			c.rec.NAttempts++
		}
		if err == nil {
			f.m.dialOK.Inc()
			f.m.ConnectLatency.Observe(lat.Seconds())
			if c.pool.Service.FirstByteTimeout == 0 { // else the backend's first bytes are its success
				b.ReportSuccess()
			}
			return nc.(*net.TCPConn), b, false
		}
		if ctx.Err() != nil { // the client went away; not the backend's fault
			return nil, nil, true
		}
		if isLocalDialError(err) {
			// This host is out of descriptors or ports: every backend
			// would fail alike and none is to blame. The client is reset.
			f.m.dialError.Inc()
			f.log.Debug("cannot open a backend connection", zap.Stringer("backend", b.Addr), zap.Error(err))
			break
		}
		switch {
		case isRefused(err):
			f.m.dialRefused.Inc()
		case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
			f.m.dialTimeout.Inc()
		default:
			f.m.dialError.Inc()
			f.log.Debug("backend dial failed", zap.Stringer("backend", b.Addr), zap.Error(err))
		}
		now = time.Now()
		b.ReportFailure(now)
	}
	return nil, nil, false
}

// watchClient runs when a dial has taken clientWatchDelay: it waits for the
// client to leave (peekGone) until the dial ends, and cancels the dial if
// it did.
func (c *conn) watchClient() {
	if peekGone(c.client) {
		c.dialCancel()
	}
	c.watchDone <- struct{}{}
}

// stopWatch stops the client watcher, waiting for it if it started.
func (c *conn) stopWatch() {
	if c.watchTimer.Stop() {
		return
	}
	_ = c.client.SetReadDeadline(aLongTimeAgo)
	<-c.watchDone
	_ = c.client.SetReadDeadline(time.Time{})
}

var aLongTimeAgo = time.Unix(1, 0)

type copyEnd uint8

const (
	endEOF copyEnd = iota
	endIdle
	endError
	endFirstByte // the backend sent nothing within the Service's FirstByteTimeout
)

// copy moves bytes from src to dst until EOF, an error or idleness, a
// spliced chunk at a time. src's read deadline is the moment the pair will
// have been idle for IdleTimeout, counting both directions; when it passes
// with the other direction active, it is moved on rather than acted upon.
func (c *conn) copy(s *splicer, dst, src *net.TCPConn, self, other *atomic.Int64, total *int64) copyEnd {
	if err := s.attach(src, dst); err != nil {
		return endError
	}
	defer s.detach()
	idle := c.f.cfg.IdleTimeout
	var idleUntil time.Time
	if idle > 0 {
		idleUntil = time.Now().Add(idle)
		_ = src.SetReadDeadline(idleUntil)
	}
	// The first-byte timeout: the client-to-backend copy starts it with
	// the first bytes it delivers by moving the backend socket's read
	// deadline, which the backend-to-client copy then sees here. If those
	// bytes went through before this copy began, the idle deadline just
	// set has replaced it: put it back (read after the set, so whichever
	// copy sets last sets the first-byte deadline).
	firstByte := c.pool.Service.FirstByteTimeout
	fromBackend := src == c.upstream
	if first := c.firstIn.Load(); fromBackend && firstByte > 0 && first != 0 {
		if until := time.Unix(0, first).Add(firstByte); idleUntil.IsZero() || until.Before(idleUntil) {
			_ = src.SetReadDeadline(until)
		}
	}
	for {
		n, err := s.chunk()
		if n > 0 {
			first := *total == 0
			*total += int64(n)
			now := time.Now()
			self.Store(now.UnixNano())
			if first && firstByte > 0 {
				if fromBackend {
					c.backend.ReportSuccess()
				} else if c.firstIn.CompareAndSwap(0, now.UnixNano()) {
					_ = c.upstream.SetReadDeadline(now.Add(firstByte))
				}
			}
		}
		switch {
		case err == nil && n == 0:
			return endEOF
		case err == nil:
			continue
		case (idle > 0 || firstByte > 0) && errors.Is(err, os.ErrDeadlineExceeded) && !closeReason(c.reason.Load()).final():
			now := time.Now()
			var until time.Time
			if first := c.firstIn.Load(); fromBackend && firstByte > 0 && *total == 0 && first != 0 {
				until = time.Unix(0, first).Add(firstByte)
				if !now.Before(until) {
					return endFirstByte
				}
			}
			if idle > 0 {
				idleUntil := time.Unix(0, max(self.Load(), other.Load())).Add(idle)
				if !now.Before(idleUntil) {
					return endIdle
				}
				if until.IsZero() || idleUntil.Before(until) {
					until = idleUntil
				}
			}
			_ = src.SetReadDeadline(until)
		default:
			return endError
		}
	}
}

// ended handles the end of one direction: half-close on EOF, close both on
// idleness, reset both on error.
func (c *conn) ended(ev copyEnd, fromClient bool) {
	switch ev {
	case endEOF:
		if fromClient {
			c.setReason(reasonClientEOF)
			_ = c.upstream.CloseWrite()
		} else {
			c.setReason(reasonBackendEOF)
			_ = c.client.CloseWrite()
		}
	case endIdle:
		c.setReason(reasonIdle)
		_ = c.client.Close()
		_ = c.upstream.Close()
	case endFirstByte:
		if c.setReason(reasonFirstByte) {
			c.backend.ReportFailure(time.Now())
			_ = c.client.SetLinger(0)
			_ = c.upstream.SetLinger(0)
		}
		_ = c.client.Close()
		_ = c.upstream.Close()
	case endError:
		r := reasonBackendReset
		if fromClient {
			r = reasonClientReset
		}
		if c.setReason(r) {
			// This direction failed first: pass the reset on.
			_ = c.client.SetLinger(0)
			_ = c.upstream.SetLinger(0)
		}
		// Otherwise the pair is already ending (idle, drain, shutdown):
		// this error is that close seen from here; close quietly.
		_ = c.client.Close()
		_ = c.upstream.Close()
	}
}

// setReason records why the pair ends (see closeReason.replaces); it
// reports whether r is now the one.
func (c *conn) setReason(r closeReason) bool {
	for {
		cur := c.reason.Load()
		if !r.replaces(closeReason(cur)) {
			return false
		}
		if c.reason.CompareAndSwap(cur, uint32(r)) {
			return true
		}
	}
}

// kill ends the connection of generation gen for reason (drain, shutdown).
func (c *conn) kill(r closeReason, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != gen || c.finished {
		return
	}
	c.setReason(r)
	_ = c.client.Close()
	_ = c.upstream.Close()
}

// release returns c to the pool, invalidating timers that still refer to it.
func (c *conn) release() {
	c.mu.Lock()
	c.gen++
	c.finished = false
	if c.drainTimer != nil {
		c.drainTimer.Stop()
		c.drainTimer = nil
	}
	c.mu.Unlock()
	c.f, c.e, c.client, c.upstream, c.pool, c.backend, c.dialCancel = nil, nil, nil, nil, nil, nil, nil
	c.reason.Store(uint32(reasonNone))
	c.draining.Store(false)
	c.firstIn.Store(0)
	c.bytesIn, c.bytesOut = 0, 0
	connPool.Put(c)
}

// connSet is the set of open connections, sharded to keep the lock off the
// accept path's critical section.
type connSet struct {
	shards [32]struct {
		mu sync.Mutex
		m  map[*conn]struct{}
	}
}

func (s *connSet) init() {
	for i := range s.shards {
		s.shards[i].m = map[*conn]struct{}{}
	}
}

func (s *connSet) add(c *conn) {
	sh := &s.shards[c.id%uint64(len(s.shards))]
	sh.mu.Lock()
	sh.m[c] = struct{}{}
	sh.mu.Unlock()
}

func (s *connSet) remove(c *conn) {
	sh := &s.shards[c.id%uint64(len(s.shards))]
	sh.mu.Lock()
	delete(sh.m, c)
	sh.mu.Unlock()
}

// each calls fn for every open connection, with its shard locked: fn must
// not block.
func (s *connSet) each(fn func(c *conn)) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for c := range sh.m {
			fn(c)
		}
		sh.mu.Unlock()
	}
}

func (s *connSet) killAll(r closeReason) int {
	n := 0
	s.each(func(c *conn) {
		n++
		c.mu.Lock()
		gen := c.gen
		c.mu.Unlock()
		go c.kill(r, gen)
	})
	return n
}
