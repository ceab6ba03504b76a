package forwarder

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/lb"
)

const maxAttempts = lb.MaxAttempts

// Forwarder is the userspace TCP proxy. Create it with New, give it
// snapshots with Apply, stop it with Shutdown.
type Forwarder struct {
	cfg    Config
	log    *zap.Logger
	m      *Metrics
	dialer net.Dialer

	snap atomic.Pointer[lb.Snapshot]

	mu        sync.Mutex // guards listeners, closed and Apply's drain pass
	listeners map[listenKey]*listenerGroup
	udp       map[lb.Frontend]*udpFrontend
	claims    map[claimKey]*os.File // NodePort claim sockets
	inherited map[string]*os.File   // handed-over sockets not yet taken
	applied   bool                  // a snapshot was applied: accept loops run
	closed    bool

	conns    connSet
	nextID   atomic.Uint64
	active   atomic.Int64
	accepts  sync.WaitGroup // accept loops
	handlers sync.WaitGroup // connection goroutines
}

type listenKey struct {
	addr     netip.AddrPort
	redirect bool
}

// listenerGroup is Workers sockets sharing one address with SO_REUSEPORT.
type listenerGroup struct {
	key listenKey
	lns []*net.TCPListener
}

// New validates cfg and opens the redirect listeners; they accept from the
// first Apply on. Frontend listeners open on the first Apply.
func New(cfg Config) (*Forwarder, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("configuring forwarder: %w", err)
	}
	f := &Forwarder{
		cfg:       cfg,
		log:       cfg.Logger.Named("forwarder"),
		m:         cfg.Metrics,
		listeners: map[listenKey]*listenerGroup{},
		udp:       map[lb.Frontend]*udpFrontend{},
		claims:    map[claimKey]*os.File{},
		inherited: maps.Clone(cfg.Inherited),
	}
	f.dialer.KeepAliveConfig = keepAliveConfig(cfg.KeepAlive)
	if cfg.Mark > 0 {
		f.dialer.Control = markControl(cfg.Mark)
	}
	f.conns.init()
	f.snap.Store(lb.NewStore(lb.StoreOptions{}).Snapshot())
	for _, addr := range cfg.Redirect {
		if _, err := f.listen(listenKey{addr: addr, redirect: true}); err != nil {
			f.closeListeners()
			return nil, err
		}
	}
	return f, nil
}

func keepAliveConfig(d time.Duration) net.KeepAliveConfig {
	if d < 0 {
		return net.KeepAliveConfig{Enable: false}
	}
	return net.KeepAliveConfig{Enable: true, Idle: d, Interval: d, Count: 9}
}

// RedirectAddrs returns the bound redirect addresses, with the ports the
// kernel chose where the Config asked for port 0.
func (f *Forwarder) RedirectAddrs() []netip.AddrPort {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []netip.AddrPort
	for k, g := range f.listeners {
		if k.redirect {
			out = append(out, g.lns[0].Addr().(*net.TCPAddr).AddrPort())
		}
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return out
}

// Active is the number of connections being forwarded.
func (f *Forwarder) Active() int64 { return f.active.Load() }

// Apply makes snap the snapshot new connections are routed with, opens and
// closes frontend listeners to match it (with BindFrontends), and starts
// draining connections whose backend snap no longer lists. Connections
// already open keep their backend. It is idempotent; errors name each
// frontend that could not be bound, and the rest is applied regardless.
func (f *Forwarder) Apply(ctx context.Context, snap *lb.Snapshot) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errors.New("applying snapshot: forwarder is shut down")
	}
	old := f.snap.Swap(snap)
	if !f.applied {
		// Accept only once there is something to route by: before, every
		// connection would be reset, and a predecessor handing its sockets
		// over is still serving them meanwhile.
		f.applied = true
		for _, g := range f.listeners {
			f.startAccepting(g)
		}
	}
	var errs []error
	if f.cfg.BindFrontends {
		errs = f.reconcileFrontends(snap)
	}
	errs = append(errs, f.reconcileUDP(snap)...)
	errs = append(errs, f.reconcileClaims(snap)...)
	for name, file := range f.inherited { // handed over, but no longer needed
		file.Close()
		delete(f.inherited, name)
	}
	if old != snap {
		f.startDrains(snap)
	}
	f.m.SnapshotVersion.Set(float64(snap.Version))
	f.m.LastApply.SetToCurrentTime()
	return errors.Join(errs...)
}

// frontendAddrs lists the TCP addresses BindFrontends listens on for snap.
func frontendAddrs(snap *lb.Snapshot) map[netip.AddrPort]bool {
	want := map[netip.AddrPort]bool{}
	for _, b := range snap.Balancers() {
		svc := b.Service
		if svc.Protocol != lb.TCP {
			continue
		}
		for _, ips := range [][]netip.Addr{svc.ClusterIPs, svc.ExternalIPs, svc.LoadBalancerIPs} {
			for _, ip := range ips {
				want[netip.AddrPortFrom(ip, svc.Port)] = true
			}
		}
		if svc.NodePort != 0 {
			// Unspecified IPv6 listens on IPv4 too (dual-stack socket).
			want[netip.AddrPortFrom(netip.IPv6Unspecified(), svc.NodePort)] = true
		}
	}
	return want
}

func (f *Forwarder) reconcileFrontends(snap *lb.Snapshot) []error {
	want := frontendAddrs(snap)
	for k, g := range f.listeners {
		if !k.redirect && !want[k.addr] {
			f.closeGroup(g)
		}
	}
	var errs []error
	for addr := range want {
		k := listenKey{addr: addr}
		if f.listeners[k] != nil {
			continue
		}
		if _, err := f.listen(k); err != nil {
			f.m.ListenErrors.Inc()
			f.log.Warn("cannot listen on frontend", zap.Stringer("frontend", addr), zap.Error(err))
			errs = append(errs, err)
		}
	}
	return errs
}

// listen opens Workers SO_REUSEPORT sockets on k.addr and starts their
// accept loops. The first socket fixes the port when k asks for port 0.
func (f *Forwarder) listen(k listenKey) (*listenerGroup, error) {
	lc := net.ListenConfig{Control: reusePort, KeepAliveConfig: keepAliveConfig(f.cfg.KeepAlive)}
	g := &listenerGroup{key: k}
	addr := k.addr
	for i := 0; i < f.cfg.Workers; i++ {
		var ln net.Listener
		var err error
		if file := f.inherit(k.socketName(i)); file != nil {
			ln, err = net.FileListener(file)
			file.Close()
		} else {
			ln, err = lc.Listen(context.Background(), "tcp", addr.String())
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
	f.listeners[k] = g
	f.m.Listeners.Add(float64(len(g.lns)))
	if f.applied {
		f.startAccepting(g)
	}
	return g, nil
}

// startAccepting starts g's accept loops.
func (f *Forwarder) startAccepting(g *listenerGroup) {
	for _, ln := range g.lns {
		f.accepts.Add(1)
		go f.acceptLoop(ln, g.key.redirect)
	}
}

func (f *Forwarder) closeGroup(g *listenerGroup) {
	for _, ln := range g.lns {
		ln.Close()
	}
	f.m.Listeners.Sub(float64(len(g.lns)))
	delete(f.listeners, g.key)
}

func (f *Forwarder) closeListeners() {
	for _, g := range f.listeners {
		f.closeGroup(g)
	}
	for k, fe := range f.udp {
		fe.close()
		delete(f.udp, k)
	}
	for k, file := range f.claims {
		file.Close()
		delete(f.claims, k)
	}
}

// inherit takes the handed-over socket called name, if there is one.
func (f *Forwarder) inherit(name string) *os.File {
	file := f.inherited[name]
	delete(f.inherited, name)
	return file
}

// Sockets returns a duplicate of every socket the forwarder listens or
// holds a port with, by a name that says what it is for, to hand over to a
// successor process (Config.Inherited). The caller closes the files.
func (f *Forwarder) Sockets() (map[string]*os.File, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]*os.File{}
	var errs []error
	add := func(name string, file *os.File, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("duplicating %s: %w", name, err))
			return
		}
		out[name] = file
	}
	for k, g := range f.listeners {
		for i, ln := range g.lns {
			file, err := ln.File()
			add(k.socketName(i), file, err)
		}
	}
	for k, fe := range f.udp {
		file, err := fe.conn.File()
		add(udpSocketName(k), file, err)
	}
	for k, c := range f.claims {
		fd, err := unix.FcntlInt(c.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		add(k.socketName(), os.NewFile(uintptr(fd), k.socketName()), err)
	}
	if err := errors.Join(errs...); err != nil {
		for _, file := range out {
			file.Close()
		}
		return nil, err
	}
	return out, nil
}

func (k listenKey) socketName(i int) string {
	kind := "frontend"
	if k.redirect {
		kind = "redirect"
	}
	return fmt.Sprintf("tcp/%s/%s/%d", kind, k.addr, i)
}

// acceptLoop accepts until ln closes. On EMFILE and its kin it first
// closes idle pooled splice pipes and retries, then backs off (5ms doubling
// to 1s) instead of spinning on a connection it cannot take: open
// connections keep flowing meanwhile.
func (f *Forwarder) acceptLoop(ln *net.TCPListener, redirect bool) {
	defer f.accepts.Done()
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
		go f.serve(c, redirect)
	}
}

// StopAccepting closes every listening socket (a successor that inherited
// them keeps them open) and waits for the accept loops to end; open
// connections go on. Later Applys fail. It reports whether this call did it.
func (f *Forwarder) StopAccepting() bool {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return false
	}
	f.closed = true
	f.closeListeners()
	f.mu.Unlock()
	f.accepts.Wait()
	return true
}

// Shutdown stops accepting, lets open connections finish until ctx ends or
// DrainTimeout passes, then closes the rest. It waits for every goroutine
// the forwarder started.
func (f *Forwarder) Shutdown(ctx context.Context) error {
	f.StopAccepting()

	ctx, cancel := context.WithTimeout(ctx, f.cfg.DrainTimeout)
	defer cancel()
	done := make(chan struct{})
	go func() { f.handlers.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	n := f.conns.killAll(reasonShutdown)
	<-done
	f.log.Info("shutdown closed connections still open after the drain timeout", zap.Int("connections", n))
	return nil
}

// startDrains schedules the end of connections whose backend snap no longer
// lists for their Service: they continue for DrainTimeout, then close unless
// the backend is listed again by then. Called with f.mu held.
func (f *Forwarder) startDrains(snap *lb.Snapshot) {
	f.conns.each(func(c *conn) {
		if !c.draining.Load() && !snap.HasEndpoint(c.pool.Service.Name, c.backend.Addr) {
			f.drain(c)
		}
	})
}

// drain marks c as a connection to an endpoint that left its Service: it
// goes on until DrainTimeout, then is closed unless the endpoint came back.
func (f *Forwarder) drain(c *conn) {
	if c.draining.Swap(true) {
		return
	}
	name, addr := c.pool.Service.Name, c.backend.Addr
	f.m.Draining.Inc()
	c.mu.Lock()
	gen := c.gen
	c.drainTimer = time.AfterFunc(f.cfg.DrainTimeout, func() {
		if !f.snap.Load().HasEndpoint(name, addr) {
			c.kill(reasonDrain, gen)
		}
	})
	c.mu.Unlock()
}
