package forwarder

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/lb"
)

// goEngine is the portable TCP engine: one accept goroutine per listening
// socket and, per connection, a goroutine that routes and dials and then
// two that copy (conn.go). Go's poller waits for it. It is the data path
// where the event loop is not built (not Linux), and on Linux when
// Config.Engine asks for it.
type goEngine struct {
	f       *Forwarder
	conns   connSet
	accepts sync.WaitGroup // accept loops
}

func newGoEngine(f *Forwarder) *goEngine {
	e := &goEngine{f: f}
	e.conns.init()
	return e
}

// goListeners is one address's Workers sockets, each with an accept loop
// once started.
type goListeners struct {
	e        *goEngine
	redirect bool
	lns      []*net.TCPListener
	started  bool
	wg       sync.WaitGroup // this group's accept loops
}

func (e *goEngine) listen(k listenKey, inherited func(i int) *os.File) (tcpListeners, error) {
	f := e.f
	lc := net.ListenConfig{Control: listenControl, KeepAliveConfig: keepAliveConfig(f.cfg.KeepAlive)}
	g := &goListeners{e: e, redirect: k.redirect}
	addr := k.addr
	network := "tcp" // an unspecified IPv6 address: dual-stack
	switch {
	case addr.Addr().Is4():
		network = "tcp4" // for "tcp", Go would listen on 0.0.0.0 with a dual-stack socket
	case f.v6only(addr):
		network = "tcp6" // Go sets IPV6_V6ONLY for it
	}
	for i := range listenSockets(f.cfg.Workers) {
		var ln net.Listener
		var err error
		if file := inherited(i); file != nil {
			ln, err = net.FileListener(file)
			file.Close()
		} else {
			ln, err = lc.Listen(context.Background(), network, addr.String())
		}
		if err != nil {
			for _, l := range g.lns {
				l.Close()
			}
			return nil, fmt.Errorf("listening on %v: %w", addr, err)
		}
		tl := ln.(*net.TCPListener)
		g.lns = append(g.lns, tl)
		if addr.Port() == 0 {
			addr = netip.AddrPortFrom(addr.Addr(), tl.Addr().(*net.TCPAddr).AddrPort().Port())
		}
	}
	return g, nil
}

func (g *goListeners) addr() netip.AddrPort { return g.lns[0].Addr().(*net.TCPAddr).AddrPort() }
func (g *goListeners) count() int           { return len(g.lns) }

func (g *goListeners) start() {
	if g.started {
		return
	}
	g.started = true
	for _, ln := range g.lns {
		g.e.accepts.Add(1)
		g.wg.Add(1)
		go g.e.acceptLoop(ln, g.redirect, &g.wg)
	}
}

func (g *goListeners) close(wait bool) {
	for _, ln := range g.lns {
		ln.Close()
	}
	if wait {
		g.wg.Wait()
	}
}

func (g *goListeners) files() ([]*os.File, error) {
	var out []*os.File
	for _, ln := range g.lns {
		file, err := ln.File()
		if err != nil {
			for _, f := range out {
				f.Close()
			}
			return nil, err
		}
		out = append(out, file)
	}
	return out, nil
}

// acceptLoop accepts until ln closes. On EMFILE and its kin it first
// closes idle pooled splice pipes and retries, then refuses the queued
// clients with the spare descriptor (a reset, at once), and only when even
// that fails backs off (5ms doubling to 1s) instead of spinning on a
// connection it cannot take: open connections keep flowing meanwhile.
func (e *goEngine) acceptLoop(ln *net.TCPListener, redirect bool, group *sync.WaitGroup) {
	defer e.accepts.Done()
	defer group.Done()
	f := e.f
	var backoff time.Duration
	var lastLog time.Time
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if isFDLimit(err) {
				f.m.acceptFDLimit.Inc()
				if shedPipes() > 0 { // idle splice pipes hold descriptors: retry with theirs
					continue
				}
				local := ln.Addr().(*net.TCPAddr).AddrPort()
				switch err := refuseQueuedTCP(ln, func(client netip.AddrPort) { f.logRefused(client, local) }); {
				case err == nil:
					continue // one queued client refused at once: the next may be too
				case errors.Is(err, syscall.EAGAIN):
					// Nobody is queued (accept says EMFILE before it
					// looks at the queue): wait for a client, not a timer.
					waitQueued(ln)
					continue
				}
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				if now := time.Now(); now.Sub(lastLog) > 10*time.Second {
					lastLog = now
					f.log.Warn("accept failing for lack of file descriptors; backing off",
						zap.Stringer("listener", ln.Addr()), zap.Duration("backoff", backoff), zap.Error(err))
				}
				time.Sleep(backoff)
				continue
			}
			f.m.acceptOther.Inc()
			if !errors.Is(err, syscall.ECONNABORTED) {
				f.log.Debug("accept failed", zap.Stringer("listener", ln.Addr()), zap.Error(err))
			}
			continue
		}
		backoff = 0
		f.handlers.Add(1)
		go e.serve(c, redirect)
	}
}

// waitQueued returns once ln has a new connection queued, or is closed.
func waitQueued(ln *net.TCPListener) {
	rc, err := ln.SyscallConn()
	if err != nil {
		return
	}
	waited := false
	_ = rc.Read(func(uintptr) bool { // false: wait for readability, then call again
		done := waited
		waited = true
		return done
	})
}

// drain schedules the end of connections whose backend snap no longer
// lists for their Service: they continue for DrainTimeout, then close
// unless the backend is listed again by then.
func (e *goEngine) drain(snap *lb.Snapshot) {
	e.conns.each(func(c *conn) {
		if !c.draining.Load() && !snap.HasEndpoint(c.pool.Service.Name, c.backend.Addr) {
			e.drainConn(c)
		}
	})
}

// drainConn marks c as a connection to an endpoint that left its Service:
// it goes on until DrainTimeout, then is closed unless the endpoint came
// back.
func (e *goEngine) drainConn(c *conn) {
	if c.draining.Swap(true) {
		return
	}
	f := e.f
	name, addr := c.pool.Service.Name, c.backend.Addr
	f.m.Draining.Inc()
	c.mu.Lock()
	gen := c.gen
	c.drainTimer = time.AfterFunc(f.cfg.DrainTimeout, func() {
		if !f.snap.Load().HasEndpoint(name, addr) {
			c.kill(reasonDrain, gen)
			return
		}
		// The endpoint came back: c no longer drains, and a later removal
		// drains it anew (copied, under mu too, counts out a c that
		// finishes still draining).
		c.mu.Lock()
		if c.gen == gen && !c.finished && c.draining.CompareAndSwap(true, false) {
			f.m.Draining.Dec()
		}
		c.mu.Unlock()
	})
	c.mu.Unlock()
}

func (e *goEngine) killAll(r closeReason) int { return e.conns.killAll(r) }

func (e *goEngine) stop() { e.accepts.Wait() }
