package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/connlog"
	"github.com/svcproxy/svcproxy/forwarder"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/proxymode"
	"github.com/svcproxy/svcproxy/redirect"
)

// dataplane is one proxy mode as the sync loop drives it.
type dataplane interface {
	// Apply makes the node serve snap; full also rewrites and prunes.
	Apply(ctx context.Context, snap *lb.Snapshot, full bool) error
	// Shutdown ends the mode on a clean exit; handedOver means a successor
	// process serves now, so the rules it relies on stay.
	Shutdown(ctx context.Context, handedOver bool) error
}

// handoverable is a dataplane whose sockets a successor process can take
// over (package handover).
type handoverable interface {
	Sockets() (map[string]*os.File, error)
	StopAccepting()
}

// probes say, per mode, whether this node can run it.
func probes(o *options, log *zap.Logger) map[proxymode.Mode]proxymode.Probe {
	return map[proxymode.Mode]proxymode.Probe{
		proxymode.IPVS: func(ctx context.Context) error { return ipvs.Available() },
		proxymode.IPTables: func(ctx context.Context) error {
			if err := linuxOnly("the iptables mode"); err != nil {
				return err
			}
			m, err := newIPTablesMode(o, log)
			if err != nil {
				return err
			}
			return m.Available(ctx)
		},
		proxymode.Userspace: func(ctx context.Context) error {
			if o.steering != "redirect" {
				return nil // listening on frontends needs nothing of the kernel
			}
			if err := linuxOnly("--steering=redirect"); err != nil {
				return err
			}
			for _, tool := range []string{"iptables-restore", "ipset"} {
				if _, err := exec.LookPath(tool); err != nil {
					return fmt.Errorf("REDIRECT steering needs %s: %w", tool, err)
				}
			}
			return nil
		},
	}
}

// newDataplane builds the chosen mode, after removing what other modes
// may have left installed (switching modes must not leave two sets of
// rules fighting over the same traffic).
func newDataplane(ctx context.Context, mode proxymode.Mode, o *options, reg prometheus.Registerer, log *zap.Logger, clog *connlog.Log, inherited map[string]*os.File) (dataplane, error) {
	if o.steering == "redirect" || mode != proxymode.Userspace {
		if err := cleanupModes(ctx, mode, o, log); err != nil {
			return nil, err
		}
	}
	switch mode {
	case proxymode.Userspace:
		return newUserspace(o, reg, log, clog, inherited)
	case proxymode.IPTables:
		m, err := newIPTablesMode(o, log)
		if err != nil {
			return nil, err
		}
		log.Info("kernel DNAT mode", zap.String("iptables", m.Backend()))
		return newKernel("iptables", m, reg, ipFamilies(o)), nil
	case proxymode.IPVS:
		m, err := newIPVSMode(o, log)
		if err != nil {
			return nil, err
		}
		go m.RunSweeper(ctx)
		return newKernel("ipvs", m, reg, ipFamilies(o)), nil
	}
	return nil, fmt.Errorf("proxy mode %s is not built into this svcproxy", mode)
}

// cleanupModes removes the rules of every mode but keep ("" removes all).
func cleanupModes(ctx context.Context, keep proxymode.Mode, o *options, log *zap.Logger) error {
	if _, err := exec.LookPath("iptables-restore"); err != nil {
		return nil // no mode can have installed anything
	}
	cleaners := map[proxymode.Mode]func() (interface{ Cleanup(context.Context) error }, error){
		proxymode.Userspace: func() (interface{ Cleanup(context.Context) error }, error) {
			return redirect.New(redirect.Config{Mark: forwarder.DefaultMark, Logger: log})
		},
		proxymode.IPTables: func() (interface{ Cleanup(context.Context) error }, error) { return newIPTablesMode(o, log) },
		proxymode.IPVS:     func() (interface{ Cleanup(context.Context) error }, error) { return newIPVSMode(o, log) },
	}
	var errs []error
	for _, mode := range []proxymode.Mode{proxymode.Userspace, proxymode.IPTables, proxymode.IPVS} {
		if mode == keep {
			continue
		}
		c, err := cleaners[mode]()
		if err == nil {
			err = c.Cleanup(ctx)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("removing %s-mode rules: %w", mode, err))
		}
	}
	return errors.Join(errs...)
}

// userspace is the forwarder, with REDIRECT steering unless --steering=none.
type userspace struct {
	fwd  *forwarder.Forwarder
	red  *redirect.Redirector // nil without steering
	port uint16
	log  *zap.Logger
}

func newUserspace(o *options, reg prometheus.Registerer, log *zap.Logger, clog *connlog.Log, inherited map[string]*os.File) (*userspace, error) {
	steer := o.steering == "redirect"
	cfg := forwarder.Config{
		Workers:            o.workers,
		BindFrontends:      !steer,
		ClaimNodePorts:     steer,
		DialTimeouts:       o.dialTimeouts,
		IdleTimeout:        o.idleTimeout,
		DrainTimeout:       o.drainTimeout,
		Mark:               o.mark,
		MaxConns:           o.maxConns,
		MaxConnsPerService: o.maxConnsPerService,
		Logger:             log,
		ConnLog:            clog,
		UDPIdleTimeout:     o.udpIdleTimeout,
		Metrics:            forwarder.NewMetrics(reg),
		Inherited:          inherited,
	}
	u := &userspace{port: o.redirectPort, log: log}
	if steer {
		cfg.Redirect = redirectAddrs(o)
		red, err := redirect.New(redirectConfig(o, log))
		if err != nil {
			return nil, err
		}
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "svcproxy", Subsystem: "redirect", Name: "repairs_total",
			Help: "Full syncs that found svcproxy's rules or sets tampered with and repaired them.",
		}, func() float64 { return float64(red.Repairs()) }))
		registerRestoreFailures(reg, ipFamilies(o), red.RestoreFailures)
		log.Info("steering with iptables REDIRECT", zap.String("iptables", red.Backend()), zap.Uint16("redirectPort", o.redirectPort))
		u.red = red
	}
	fwd, err := forwarder.New(cfg)
	if err != nil {
		return nil, err
	}
	u.fwd = fwd
	return u, nil
}

// redirectAddrs are the forwarder's redirect listeners: 0.0.0.0:port, and
// [::]:port when the node serves IPv6.
func redirectAddrs(o *options) []netip.AddrPort {
	addrs := []netip.AddrPort{netip.AddrPortFrom(netip.IPv4Unspecified(), o.redirectPort)}
	if o.ipv6 {
		addrs = append(addrs, netip.AddrPortFrom(netip.IPv6Unspecified(), o.redirectPort))
	}
	return addrs
}

func redirectConfig(o *options, log *zap.Logger) redirect.Config {
	return redirect.Config{Mark: uint32(o.mark), NodePortAddresses: o.nodePortAddresses, IPv6: o.ipv6, Logger: log}
}

func (u *userspace) Apply(ctx context.Context, snap *lb.Snapshot, full bool) error {
	if err := u.fwd.Apply(ctx, snap); err != nil {
		// Frontends that cannot be bound are reported, not fatal: the
		// rest of the snapshot is served.
		u.log.Warn("applied snapshot with errors", zap.Uint64("version", snap.Version), zap.Error(err))
	}
	if u.red == nil {
		return nil
	}
	return u.red.Apply(ctx, snap, redirect.Ports{TCP: u.port, UDP: u.fwd.UDPPorts()}, full)
}

// Sockets are the forwarder's, for a successor process.
func (u *userspace) Sockets() (map[string]*os.File, error) { return u.fwd.Sockets() }

// StopAccepting leaves new connections to the successor.
func (u *userspace) StopAccepting() { u.fwd.StopAccepting() }

// Shutdown drains the forwarder, then removes the steering rules unless a
// successor relies on them: during the drain, new connections to Services
// are refused at once by the closed redirect port rather than blackholed.
func (u *userspace) Shutdown(ctx context.Context, handedOver bool) error {
	err := u.fwd.Shutdown(ctx)
	if u.red != nil && !handedOver {
		if cerr := u.red.Cleanup(ctx); cerr != nil {
			err = errors.Join(err, fmt.Errorf("removing steering rules: %w", cerr))
		} else {
			u.log.Info("removed steering rules")
		}
	}
	return err
}
