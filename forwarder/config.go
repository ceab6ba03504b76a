package forwarder

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"time"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/connlog"
	"github.com/svcproxy/svcproxy/lb"
)

// DefaultMark is the SO_MARK put on the forwarder's upstream sockets so its
// own dials never match its steering rules.
const DefaultMark = 0x80000

// Config configures a Forwarder. Zero values mean the stated defaults.
type Config struct {
	// Workers is the number of SO_REUSEPORT sockets (and accept loops) per
	// listening address. Zero: GOMAXPROCS. Linux only: elsewhere each
	// address has one socket (see "Other systems" in the package comment).
	Workers int

	// Unbalanced leaves each TCP connection on the worker whose socket
	// accepted it (SO_REUSEPORT's hash of its addresses). By default a
	// worker that accepts a connection while another has clearly fewer
	// (two, and a sixteenth of its own) hands it over, so that a few
	// long-lived connections share the cores. Event loop only.
	Unbalanced bool

	// Engine chooses how TCP connections are moved: EngineEventLoop (per-core
	// epoll loops; Linux only) or EngineGoroutines (a goroutine per
	// connection through Go's poller). Empty: EngineEventLoop on Linux,
	// EngineGoroutines elsewhere.
	Engine Engine

	// Redirect are the addresses steering rules redirect connections to;
	// connections there are routed by their original destination. A zero
	// port lets the kernel choose one (see RedirectAddrs). For both
	// families, give 0.0.0.0:port and [::]:port: the IPv6 sockets are then
	// IPv6-only (IPV6_V6ONLY), and UDP NodePorts get an IPv6 socket too
	// (see UDPPorts). Linux only (SO_ORIGINAL_DST): elsewhere New fails
	// with errors.ErrUnsupported.
	Redirect []netip.AddrPort

	// BindFrontends makes the forwarder also listen on every TCP frontend of
	// the snapshot (see the package comment). Frontends that cannot be bound
	// (an address not on this host, a port in use) are logged and counted.
	BindFrontends bool

	// IPv6 says the node serves IPv6. With BindFrontends, UDP NodePorts
	// then get an IPv6 socket ([::]:port, IPv6-only) beside the IPv4 one;
	// TCP NodePorts' dual-stack socket takes both families anyway. (With
	// Redirect, an IPv6 redirect address says it.)
	IPv6 bool

	// ClaimNodePorts holds every NodePort with a bound, unused socket, so no
	// other program can take it while steering rules redirect its traffic.
	// For use with Redirect; BindFrontends listens on NodePorts anyway.
	// Linux only, like Redirect.
	ClaimNodePorts bool

	// UDPPorts are the ports to bind UDP frontend sockets to with Redirect
	// (without BindFrontends), when free: the ports a previous process's
	// steering rules still redirect to (redirect.Redirector.SteeredUDP), so
	// the flows conntrack keeps sending there land on the same frontend.
	// A frontend not here, or whose port is taken, gets one the kernel
	// chooses.
	UDPPorts map[lb.Frontend]uint16

	// Inherited are sockets handed over by the previous svcproxy process,
	// by the names Sockets gives them (see package handover). A socket the
	// forwarder needs is taken from here before one is bound; the rest are
	// closed after the first Apply.
	Inherited map[string]*os.File

	// DialTimeouts are the per-attempt backend connect timeouts; their
	// number bounds the attempts per connection, each to a different
	// backend. Nil: 250ms, 500ms, 1s, 2s.
	DialTimeouts []time.Duration

	// IdleTimeout closes a connection after this long with no bytes in
	// either direction. Zero: 1h. Negative: never.
	IdleTimeout time.Duration

	// DrainTimeout bounds how long connections to a removed backend, and all
	// connections at Shutdown, may continue. Zero: 30s.
	DrainTimeout time.Duration

	// KeepAlive is the TCP keepalive idle time on both sides. Zero: 15s.
	// Negative disables keepalives.
	KeepAlive time.Duration

	// Inside reports whether a client address is inside the cluster: a
	// pod's (within the cluster CIDRs) or one of this node's own. A
	// client inside that connects to an external frontend (a NodePort,
	// ExternalIP or LoadBalancer IP) of a Service whose external traffic
	// policy is Local is served by its Cluster policy's endpoints
	// (lb.Pool.ShortCircuit), as kube-proxy short-circuits it, instead of
	// this node's endpoints alone. It is asked only for such connections,
	// and must be fast and safe for concurrent use. Nil: no client is
	// inside.
	Inside func(netip.Addr) bool

	// Mark is the SO_MARK of upstream sockets. Zero: DefaultMark.
	// Negative: no mark (needs no CAP_NET_ADMIN; for tests and static mode).
	// Linux only: elsewhere zero means no mark, and a positive one is
	// logged as unsupported and not set (there are no steering rules for
	// it to bypass).
	Mark int

	// UDPIdleTimeout ends a UDP flow after this long without datagrams
	// either way. Zero: 30s.
	UDPIdleTimeout time.Duration

	// UDPReceiveBuffer sets the receive buffer (SO_RCVBUF) of UDP frontend
	// sockets and of each flow's backend socket, in bytes; 0 leaves the
	// kernel's default (net.core.rmem_default). Past net.core.rmem_max it
	// takes CAP_NET_ADMIN (SO_RCVBUFFORCE); without it the kernel caps the
	// size there. Datagrams that find the buffer full are dropped and
	// counted (svcproxy_forwarder_udp_receive_drops_total).
	UDPReceiveBuffer int

	// MaxUDPFlows caps open UDP flows; datagrams that would open more are
	// dropped and counted. Zero: 65536. Negative: unlimited.
	MaxUDPFlows int64

	// MaxConns caps open connections in total; MaxConnsPerService caps them
	// per Service port. Zero: unlimited. Connections over a cap are reset.
	MaxConns           int64
	MaxConnsPerService int64

	// Offload moves established TCP connections' bytes in the kernel:
	// OffloadSockmap (Linux, EngineEventLoop only). Empty or OffloadNone:
	// off. When the kernel refuses the sockmap program at New, the reason
	// is logged and the forwarder runs without offload.
	Offload Offload

	// Offloader, if set with Offload, is used instead of the Sockmap
	// Offload would load (tests: offloadtest.Fake). The forwarder does not
	// close it.
	Offloader Offloader

	// IOUring says whether the event loop moves small messages in batches
	// through io_uring (batch_linux.go): IOUringAuto (empty) where the
	// kernel allows it, IOUringOff never. Where the kernel or a sandbox
	// refuses io_uring, the reason is logged and the loop makes a read and
	// a write per message. Offload turns it off.
	IOUring IOUring

	Logger  *zap.Logger  // nil: no logging
	ConnLog *connlog.Log // nil: no connection log
	Metrics *Metrics     // nil: metrics kept but not registered
}

// IOUring says whether the event loop may use io_uring (see Config.IOUring).
type IOUring string

const (
	IOUringAuto IOUring = "auto"
	IOUringOff  IOUring = "off"
)

// Engine names a TCP engine (see Config.Engine).
type Engine string

const (
	EngineEventLoop  Engine = "eventloop"
	EngineGoroutines Engine = "goroutines"
)

var defaultDialTimeouts = []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second}

func (c Config) withDefaults() (Config, error) {
	if c.Workers == 0 {
		c.Workers = runtime.GOMAXPROCS(0)
	}
	if c.Engine == "" {
		c.Engine = defaultEngine
	}
	if c.Engine != EngineEventLoop && c.Engine != EngineGoroutines {
		return c, fmt.Errorf("engine: want %q or %q, got %q", EngineEventLoop, EngineGoroutines, c.Engine)
	}
	if c.Engine == EngineEventLoop && defaultEngine != EngineEventLoop {
		return c, fmt.Errorf("engine: %q is built for Linux only", EngineEventLoop)
	}
	switch c.Offload {
	case "", OffloadNone:
		c.Offload = OffloadNone
	case OffloadSockmap:
		if c.Engine != EngineEventLoop {
			return c, fmt.Errorf("offload: %q needs engine %q, got %q", OffloadSockmap, EngineEventLoop, c.Engine)
		}
	default:
		return c, fmt.Errorf("offload: want %q or %q, got %q", OffloadNone, OffloadSockmap, c.Offload)
	}
	switch c.IOUring {
	case "":
		c.IOUring = IOUringAuto
	case IOUringAuto, IOUringOff:
	default:
		return c, fmt.Errorf("ioUring: want %q or %q, got %q", IOUringAuto, IOUringOff, c.IOUring)
	}
	if c.Workers < 0 {
		return c, fmt.Errorf("workers: must not be negative, got %d", c.Workers)
	}
	if c.DialTimeouts == nil {
		c.DialTimeouts = defaultDialTimeouts
	}
	if len(c.DialTimeouts) == 0 || len(c.DialTimeouts) > maxAttempts {
		return c, fmt.Errorf("dialTimeouts: want 1 to %d attempts, got %d", maxAttempts, len(c.DialTimeouts))
	}
	for i, d := range c.DialTimeouts {
		if d <= 0 {
			return c, fmt.Errorf("dialTimeouts[%d]: must be positive, got %v", i, d)
		}
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = time.Hour
	}
	if c.UDPIdleTimeout == 0 {
		c.UDPIdleTimeout = 30 * time.Second
	}
	if c.UDPIdleTimeout < 0 {
		return c, fmt.Errorf("udpIdleTimeout: must be positive, got %v", c.UDPIdleTimeout)
	}
	if c.UDPReceiveBuffer < 0 {
		return c, fmt.Errorf("udpReceiveBuffer: must not be negative, got %d", c.UDPReceiveBuffer)
	}
	if c.MaxUDPFlows == 0 {
		c.MaxUDPFlows = 65536
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 30 * time.Second
	}
	if c.DrainTimeout < 0 {
		return c, fmt.Errorf("drainTimeout: must not be negative, got %v", c.DrainTimeout)
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = 15 * time.Second
	}
	if c.Mark == 0 {
		c.Mark = defaultMark
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics(nil)
	}
	if err := c.checkPlatform(); err != nil {
		return c, err
	}
	return c, nil
}
