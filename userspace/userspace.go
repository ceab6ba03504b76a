// Package userspace is the userspace proxy mode: the forwarder serving
// every Service, and what brings Service traffic to it. Three steerings:
//
//   - redirect: REDIRECT rules (package redirect) send every frontend to
//     the forwarder's redirect port, where it reads the original
//     destination from conntrack. Every packet of a proxied connection's
//     client side is tracked and NATed.
//   - local: the frontends' virtual IPs become local addresses of the node
//     on a dummy interface (LocalVIPs, as kube-proxy's IPVS mode puts them
//     on kube-ipvs0) and the forwarder listens on each frontend: no rule,
//     no NAT, so no per-packet netfilter work where nothing else asks for
//     conntrack. It costs a listening socket per frontend and worker.
//   - none: the forwarder listens on each frontend, whose addresses must
//     be the node's already (loopback, a static services file).
package userspace

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/vishvananda/netns"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/forwarder"
	"github.com/svcproxy/svcproxy/iface"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/proxymode"
	"github.com/svcproxy/svcproxy/redirect"
)

// Config configures a Mode.
type Config struct {
	// Forwarder configures the forwarder. New sets its BindFrontends,
	// ClaimNodePorts and Redirect from Steering.
	Forwarder forwarder.Config
	// Steering configures the REDIRECT rules. Nil: no steering, the
	// forwarder binds every frontend itself.
	Steering *redirect.Config
	// LocalVIPs, without Steering, puts the frontends' virtual IPs on a
	// dummy interface for the forwarder to listen on (local steering).
	// Nil: the addresses are left as they are.
	LocalVIPs *LocalVIPs
	// RedirectPort is the TCP port redirected connections arrive on, on
	// 0.0.0.0 and, when Steering.IPv6, on [::].
	RedirectPort uint16
	// Logger; nil: no logging.
	Logger *zap.Logger
}

// Mode is the forwarder, with REDIRECT steering when configured.
type Mode struct {
	fwd   *forwarder.Forwarder
	red   *redirect.Redirector // nil without steering
	steer redirect.Config      // what red was made from
	// vips is local steering's device, nil without it.
	vips *vips
	// mu serializes Apply with StopAccepting and Close; once stopped,
	// Apply does nothing: the steering (the rules or the device) is a
	// successor's, or being removed.
	mu      sync.Mutex
	stopped bool
	port    uint16
	log     *zap.Logger
}

// New builds the mode: the forwarder binds its redirect listeners (or
// takes over the inherited ones) at once; the rules are written by Apply.
func New(cfg Config) (*Mode, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	fc := cfg.Forwarder
	steer := cfg.Steering != nil
	fc.BindFrontends, fc.ClaimNodePorts = !steer, steer
	m := &Mode{port: cfg.RedirectPort, log: cfg.Logger}
	if cfg.LocalVIPs != nil {
		if steer {
			return nil, errors.New("userspace mode: REDIRECT and local steering are exclusive")
		}
		v, err := newVIPs(*cfg.LocalVIPs, cfg.Logger)
		if err != nil {
			return nil, err
		}
		m.vips = v
	}
	if steer {
		fc.Redirect = RedirectAddrs(cfg.RedirectPort, cfg.Steering.IPv6)
		red, err := redirect.New(*cfg.Steering)
		if err != nil {
			return nil, err
		}
		m.red, m.steer = red, *cfg.Steering
		if fc.UDPPorts == nil {
			// Bind the UDP frontends where a previous process's rules
			// still steer them, so flows conntrack sends there are kept.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			fc.UDPPorts, err = red.SteeredUDP(ctx)
			cancel()
			if err != nil {
				m.log.Debug("cannot read the UDP ports a previous process steered to", zap.Error(err))
			}
		}
	}
	fwd, err := forwarder.New(fc)
	if err != nil {
		if m.vips != nil {
			m.vips.release()
		}
		return nil, err
	}
	m.fwd = fwd
	return m, nil
}

// RedirectAddrs are the forwarder's redirect listeners: 0.0.0.0:port, and
// [::]:port when the node serves IPv6.
func RedirectAddrs(port uint16, ipv6 bool) []netip.AddrPort {
	addrs := []netip.AddrPort{netip.AddrPortFrom(netip.IPv4Unspecified(), port)}
	if ipv6 {
		addrs = append(addrs, netip.AddrPortFrom(netip.IPv6Unspecified(), port))
	}
	return addrs
}

// Available reports why this node cannot run the userspace mode, or nil:
// listening on frontends (steering nil) needs nothing of the kernel;
// steering needs Linux and a steering backend that works here under
// steering.Backend (redirect.Available: nftables when the kernel takes a
// throwaway table, one netlink transaction; else iptables, which also
// needs iptables-restore and ipset).
func Available(ctx context.Context, steering *redirect.Config) error {
	if steering == nil {
		return nil
	}
	if err := proxymode.LinuxOnly("--steering=redirect"); err != nil {
		return err
	}
	cfg := *steering
	cfg.Logger = nil // a probe: New logs what it chose when the mode is built
	backend, err := redirect.Available(ctx, cfg)
	if err != nil {
		return fmt.Errorf("REDIRECT steering: %w", err)
	}
	if backend == redirect.BackendIPTables && cfg.Exec == nil {
		for _, tool := range []string{"iptables-restore", "ipset"} {
			if _, err := exec.LookPath(tool); err != nil {
				return fmt.Errorf("REDIRECT steering with iptables needs %s: %w", tool, err)
			}
		}
	}
	return nil
}

// LocalAvailable reports why this node cannot steer locally: it needs
// Linux's rtnetlink. (It needs CAP_NET_ADMIN too; short of touching the
// node, only the first Apply finds that out, and fails.)
func LocalAvailable() error {
	if err := proxymode.LinuxOnly("--steering=local"); err != nil {
		return err
	}
	l, err := iface.New(netns.None())
	if err != nil {
		return fmt.Errorf("local steering: %w", err)
	}
	l.Close()
	return nil
}

// Available reports why this node cannot run m (the package's Available,
// for the steering backend m chose).
func (m *Mode) Available(ctx context.Context) error {
	if m.vips != nil {
		return LocalAvailable()
	}
	if m.red == nil {
		return Available(ctx, nil)
	}
	cfg := m.steer
	cfg.Backend = m.red.Backend()
	return Available(ctx, &cfg)
}

// Apply makes the forwarder serve snap and steers its frontends to it.
// With local steering the virtual IPs are added before the forwarder binds
// them and removed after it closed their listeners; an address that cannot
// be added or removed is logged and retried on the next sync, as a
// frontend that cannot be bound is, and only a device that cannot be made
// fails the Apply. Once the mode stopped accepting (handed over) or is
// closing, Apply does nothing: the forwarder takes no snapshot any more,
// and the steering rules or device are a successor's, or being removed.
func (m *Mode) Apply(ctx context.Context, snap *lb.Snapshot, full bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return nil
	}
	var vipErr error
	var vips map[netip.Addr]bool
	if m.vips != nil {
		vips = virtualIPs(snap, m.vips.ipv6)
		vipErr = m.vips.add(ctx, vips, full)
	}
	if err := m.fwd.Apply(ctx, snap); err != nil {
		// Frontends that cannot be bound are reported, not fatal: the
		// rest of the snapshot is served.
		m.log.Warn("applied snapshot with errors", zap.Uint64("version", snap.Version), zap.Error(err))
	}
	switch {
	case m.vips != nil:
		m.vips.prune(ctx, vips)
		return vipErr
	case m.red != nil:
		return m.red.Apply(ctx, snap, redirect.Ports{TCP: m.port, UDP: m.fwd.UDPPorts()}, full)
	}
	return nil
}

// Cleanup removes the steering rules and sets, or local steering's
// device, if m steers.
func (m *Mode) Cleanup(ctx context.Context) error {
	if m.vips != nil {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.vips.remove(ctx)
	}
	if m.red == nil {
		return nil
	}
	return m.red.Cleanup(ctx)
}

// CleanupSteering removes every steering rule, set and table, whoever
// installed them, with the tools in this network namespace: both
// backends' (redirect.Cleanup). Its redirector is auto's, so it works
// with either backend alone: nftables without iptables, iptables where
// the kernel refuses the table.
func CleanupSteering(ctx context.Context, log *zap.Logger) error {
	red, err := redirect.New(redirect.Config{Backend: redirect.BackendAuto, Mark: forwarder.DefaultMark, Logger: log})
	if err != nil {
		return err
	}
	return red.Cleanup(ctx)
}

// CleanupLocal deletes local steering's dummy interface (DefaultVIPDevice)
// and the virtual IPs on it, if it exists. Where there is no rtnetlink
// (not Linux) there is nothing to delete.
func CleanupLocal(ctx context.Context, log *zap.Logger) error {
	v, err := newVIPs(LocalVIPs{}, log)
	if errors.Is(err, errors.ErrUnsupported) {
		return nil
	}
	if err != nil {
		return err
	}
	defer v.release()
	return v.remove(ctx)
}

// Close drains the forwarder, then removes the steering rules (or local
// steering's device) unless a successor relies on them: during the drain,
// new connections to Services are refused at once by the closed listeners
// rather than blackholed.
func (m *Mode) Close(ctx context.Context, handedOver bool) error {
	err := m.fwd.Shutdown(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stopped = true
	if m.vips != nil {
		if !handedOver {
			if cerr := m.vips.remove(ctx); cerr != nil {
				err = errors.Join(err, cerr)
			} else {
				m.log.Info("removed the virtual IPs", zap.String("device", m.vips.dev))
			}
		}
		m.vips.release()
	}
	if m.red != nil && !handedOver {
		if cerr := m.red.Cleanup(ctx); cerr != nil {
			err = errors.Join(err, fmt.Errorf("removing steering rules: %w", cerr))
		} else {
			m.log.Info("removed steering rules")
		}
	}
	return err
}

// Sockets are the forwarder's, for a successor process.
func (m *Mode) Sockets() (map[string]*os.File, error) { return m.fwd.Sockets() }

// SocketsGeneration counts changes to the forwarder's sockets.
func (m *Mode) SocketsGeneration() uint64 { return m.fwd.SocketsGeneration() }

// StopAccepting leaves new connections to the successor, and the
// steering too (its rules, or local steering's device): a later Apply does
// nothing.
func (m *Mode) StopAccepting() {
	m.mu.Lock()
	m.stopped = true
	m.mu.Unlock()
	m.fwd.StopAccepting()
}

// Active is the number of connections the forwarder has open.
func (m *Mode) Active() int64 { return m.fwd.Active() }

// LocalVIPs reports local steering's device: the virtual IPs on it, and
// how many times an address could not be added or removed. Zero without
// local steering; safe to call at any time (metrics).
func (m *Mode) LocalVIPs() (addresses int, failures uint64) {
	if m.vips == nil {
		return 0, 0
	}
	return int(m.vips.count.Load()), m.vips.failed.Load()
}

// Steering is the redirector's, nil without steering: its backend, repair
// and restore-failure counts.
func (m *Mode) Steering() *redirect.Redirector { return m.red }
