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
	"time"

	"go.uber.org/zap"

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

	tcp tcpEngine // moves the TCP connections: an event loop, or goroutines

	mu        sync.Mutex // guards listeners, closed and Apply's drain pass
	listeners map[listenKey]tcpListeners
	udp       map[lb.Frontend]udpSocket
	claims    map[claimKey]*os.File // NodePort claim sockets
	inherited map[string]*os.File   // handed-over sockets not yet taken
	applied   bool                  // a snapshot was applied: accept loops run
	closed    bool
	unserved  map[lb.ServicePortName]bool // SCTP Service ports already warned about
	// socketsGen counts changes to the sockets Sockets returns.
	socketsGen uint64

	nextID atomic.Uint64
	// refusedLogged is when (Unix ns) a refusal for lack of
	// descriptors was last logged: at most one line per 10 s.
	refusedLogged atomic.Int64
	active        atomic.Int64
	handlers      sync.WaitGroup // open connections and UDP goroutines
}

type listenKey struct {
	addr     netip.AddrPort
	redirect bool
}

// tcpEngine moves the forwarder's TCP connections: it listens, accepts,
// routes, dials and relays. On Linux it is the event loop (loop_linux.go);
// the goroutine-per-connection engine (conn.go) is the portable one, and
// Config.Engine selects it on Linux too.
type tcpEngine interface {
	// listen opens Workers listening sockets sharing addr (SO_REUSEPORT),
	// taking socket i from inherited(i) when a predecessor handed it over.
	// They accept from start on.
	listen(k listenKey, inherited func(i int) *os.File) (tcpListeners, error)
	// drain starts draining the open connections whose backend snap no
	// longer lists for their Service.
	drain(snap *lb.Snapshot)
	// killAll ends every open connection for r and returns how many.
	killAll(r closeReason) int
	// stop releases the engine once no connection is open.
	stop()
}

// tcpListeners is one address's Workers sockets.
type tcpListeners interface {
	addr() netip.AddrPort // the bound address, with the kernel's port for port 0
	count() int
	start()                     // accept from now on
	close(wait bool)            // stop accepting and close; wait: until no accept runs
	files() ([]*os.File, error) // duplicates, for a successor (nil: that socket has none to give)
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
		listeners: map[listenKey]tcpListeners{},
		udp:       map[lb.Frontend]udpSocket{},
		claims:    map[claimKey]*os.File{},
		inherited: maps.Clone(cfg.Inherited),
	}
	holdSpare()
	readDrops := f.readDrops
	f.m.refreshDrops.Store(&readDrops)
	f.dialer.KeepAliveConfig = keepAliveConfig(cfg.KeepAlive)
	if cfg.Mark > 0 {
		f.dialer.Control = markControl(cfg.Mark)
	}
	if f.tcp, err = newEngine(f); err != nil {
		return nil, fmt.Errorf("starting forwarder: %w", err)
	}
	f.snap.Store(lb.NewStore(lb.StoreOptions{}).Snapshot())
	for _, addr := range cfg.Redirect {
		if _, err := f.listen(listenKey{addr: addr, redirect: true}); err != nil {
			f.closeListeners(true)
			f.tcp.stop()
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
			out = append(out, g.addr())
		}
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return out
}

// Active is the number of connections being forwarded.
func (f *Forwarder) Active() int64 { return f.active.Load() }

// route returns the pool that serves a connection from client to dst: the
// one the snapshot routes dst to, or its short circuit when it has one and
// the client is inside the cluster (Config.Inside). Nil: no Service.
func (f *Forwarder) route(proto lb.Protocol, client netip.Addr, dst netip.AddrPort) *lb.Pool {
	p := f.snap.Load().Route(proto, dst)
	if p == nil {
		return nil
	}
	if sc := p.ShortCircuit(); sc != nil && f.cfg.Inside != nil && f.cfg.Inside(client.Unmap()) {
		return sc
	}
	return p
}

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
			g.start()
		}
	}
	var errs []error
	if f.cfg.BindFrontends {
		errs = f.reconcileFrontends(snap)
	}
	errs = append(errs, f.reconcileUDP(snap)...)
	errs = append(errs, f.reconcileClaims(snap)...)
	f.warnUnserved(snap)
	for name, file := range f.inherited { // handed over, but no longer needed
		file.Close()
		delete(f.inherited, name)
	}
	if old != snap {
		f.tcp.drain(snap)
	}
	f.m.SnapshotVersion.Set(float64(snap.Version))
	f.m.LastApply.SetToCurrentTime()
	return errors.Join(errs...)
}

// warnUnserved warns once about each SCTP Service port in snap: the
// forwarder has no SCTP sockets. A port removed and added again is warned
// about again.
func (f *Forwarder) warnUnserved(snap *lb.Snapshot) {
	var now map[lb.ServicePortName]bool
	for _, b := range snap.Balancers() {
		svc := b.Service
		if svc.Protocol != lb.SCTP {
			continue
		}
		if now == nil {
			now = map[lb.ServicePortName]bool{}
		}
		now[svc.Name] = true
		if !f.unserved[svc.Name] {
			f.log.Warn("SCTP is served by the kernel modes only: this Service port is not proxied (use --proxy-mode=iptables or ipvs)",
				zap.Stringer("service", svc.Name), zap.Uint16("port", svc.Port))
		}
	}
	f.unserved = now
}

// frontendAddrs lists the TCP addresses BindFrontends listens on for snap.
func frontendAddrs(snap *lb.Snapshot) map[netip.AddrPort]bool {
	want := map[netip.AddrPort]bool{}
	for _, b := range snap.Balancers() {
		if b.Service.Protocol != lb.TCP {
			continue
		}
		for fe := range snap.Frontends(b) {
			want[fe.Addr] = true
		}
		if np := snap.NodePort(b); np != 0 {
			// Unspecified IPv6 listens on IPv4 too (dual-stack socket).
			want[netip.AddrPortFrom(netip.IPv6Unspecified(), np)] = true
		}
	}
	return want
}

func (f *Forwarder) reconcileFrontends(snap *lb.Snapshot) []error {
	want := frontendAddrs(snap)
	for k, g := range f.listeners {
		if !k.redirect && !want[k.addr] {
			f.closeGroup(k, g, false)
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

// listen opens k's listening sockets; they accept once a snapshot was
// applied.
func (f *Forwarder) listen(k listenKey) (tcpListeners, error) {
	g, err := f.tcp.listen(k, func(i int) *os.File { return f.inherit(k.socketName(i)) })
	if err != nil {
		return nil, err
	}
	f.listeners[k] = g
	f.socketsGen++
	f.m.Listeners.Add(float64(g.count()))
	if f.applied {
		g.start()
	}
	return g, nil
}

func (f *Forwarder) closeGroup(k listenKey, g tcpListeners, wait bool) {
	g.close(wait)
	f.m.Listeners.Sub(float64(g.count()))
	delete(f.listeners, k)
	f.socketsGen++
}

// closeListeners closes every listening socket; wait: returns once no
// accept runs.
func (f *Forwarder) closeListeners(wait bool) {
	for k, g := range f.listeners {
		f.closeGroup(k, g, wait)
	}
	for k, fe := range f.udp {
		fe.close()
		delete(f.udp, k)
		f.socketsGen++
	}
	for k, file := range f.claims {
		file.Close()
		delete(f.claims, k)
		f.socketsGen++
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
		files, err := g.files()
		if err != nil {
			errs = append(errs, fmt.Errorf("duplicating %v listeners: %w", k.addr, err))
			continue
		}
		for i, file := range files {
			if file != nil { // nil: socket i has nothing to hand over
				out[k.socketName(i)] = file
			}
		}
	}
	for k, fe := range f.udp {
		file, err := fe.file()
		add(udpSocketName(k), file, err)
	}
	for k, c := range f.claims {
		file, err := dupClaim(k, c)
		add(k.socketName(), file, err)
	}
	if err := errors.Join(errs...); err != nil {
		for _, file := range out {
			file.Close()
		}
		return nil, err
	}
	return out, nil
}

// SocketsGeneration counts the changes to the set of sockets Sockets
// returns (a listener, UDP frontend or NodePort claim opened or closed):
// equal counts, the same sockets.
func (f *Forwarder) SocketsGeneration() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.socketsGen
}

// v6only reports whether the sockets of a listener on addr are IPv6-only
// (IPV6_V6ONLY): an unspecified IPv6 address whose port also has an IPv4
// redirect listener on 0.0.0.0, which takes that family's connections.
// Otherwise an unspecified IPv6 address is dual-stack, as Go's "tcp".
func (f *Forwarder) v6only(addr netip.AddrPort) bool {
	if addr.Addr() != netip.IPv6Unspecified() {
		return false
	}
	return slices.Contains(f.cfg.Redirect, netip.AddrPortFrom(netip.IPv4Unspecified(), addr.Port()))
}

func (k listenKey) socketName(i int) string {
	kind := "frontend"
	if k.redirect {
		kind = "redirect"
	}
	return fmt.Sprintf("tcp/%s/%s/%d", kind, k.addr, i)
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
	f.closeListeners(true)
	f.mu.Unlock()
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
		f.tcp.stop()
		return nil
	case <-ctx.Done():
	}
	n := f.tcp.killAll(reasonShutdown)
	<-done
	f.tcp.stop()
	f.log.Info("shutdown closed connections still open after the drain timeout", zap.Int("connections", n))
	return nil
}
