// Package daemon runs svcproxy on a node: it chooses the proxy mode, takes
// over from a running predecessor, feeds the Services a source loads into
// the load-balancer store and carries every snapshot to the mode through
// the sync runner, serves metrics and health, returns memory, and shuts
// down (or hands over) cleanly. Everything it drives is injected (Config),
// so a test runs it with fakes; cmd/svcproxy only parses flags and wires.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/handover"
	"github.com/svcproxy/svcproxy/health"
	"github.com/svcproxy/svcproxy/healthcheck"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/proxymode"
	"github.com/svcproxy/svcproxy/runner"
)

// Registry is where the daemon registers its metrics and what /metrics
// serves: a *prometheus.Registry.
type Registry interface {
	prometheus.Registerer
	prometheus.Gatherer
}

// Config is what Run drives. The fields without a default are required.
type Config struct {
	Logger   *zap.Logger
	Registry Registry
	Store    *lb.Store
	// Source feeds Store (FileSource, KubeSource).
	Source Source
	// Tracker is /healthz's: told of queued changes and applied syncs.
	Tracker *health.Tracker
	// HealthChecks, if set, serves the health-check node ports of the
	// Services in each applied snapshot (kube-proxy's, for Services with
	// externalTrafficPolicy: Local; only API Services have them).
	HealthChecks *healthcheck.Server

	// Modes are the proxy modes this svcproxy can run; Mode is the one
	// asked for ("": Annotation's, else userspace), falling back as
	// proxymode.Choose does.
	Modes      proxymode.Table
	Mode       proxymode.Name
	Annotation string // the Node's proxymode.Annotation
	// Firewall, if set, enforces the Services' loadBalancerSourceRanges
	// (package firewall), for whichever mode runs: each sync applies it
	// before the mode. It stays after the process (the kernel modes'
	// rules go on forwarding, restricted), and Cleanup removes it.
	Firewall Firewall
	// Steering is the userspace mode's: "redirect" writes rules and
	// "local" puts the virtual IPs on a device, so the other modes' rules
	// are removed first (with "none" they are left alone).
	Steering string
	// IPv6 decides whether mode serves IPv6 on this node: nil if it does,
	// else why not.
	IPv6 func(ctx context.Context, mode proxymode.Name) error
	// KubeProxy finds kube-proxy's rules on this node, for a warning.
	KubeProxy KubeProxyTraces

	// Succession takes over from a predecessor and hands over to a
	// successor; Termination decides when a signal ends the daemon.
	Succession  *handover.Succession
	Termination *handover.Termination

	// NewRunner builds the sync loop around sync. Nil: runner.New with
	// MinSyncPeriod and SyncPeriod.
	NewRunner     func(sync func(ctx context.Context, full bool) error) *runner.Runner
	MinSyncPeriod time.Duration
	SyncPeriod    time.Duration
	DrainTimeout  time.Duration

	// WatchRules, if set, reports changes that another process makes to
	// the rules of the mode running (netfilter.WatchRuleset): each asks
	// for a full sync at once, so tampering is repaired within
	// MinSyncPeriod rather than at the next SyncPeriod, which stays the
	// backstop. An error means no watch (logged).
	WatchRules func(ctx context.Context, mode proxymode.Name, changed func()) error

	MetricsAddr, HealthzAddr, ProfilingAddr string // "": off
	ConnLog                                 string // logged only
	PIDFile                                 string // "": none
}

// Firewall is what the daemon needs of package firewall's Firewall.
type Firewall interface {
	// Apply writes what snap restricts. The rules outlive the process,
	// as the kernel modes' forwarding rules do (the next process's first
	// Apply replaces them); --cleanup removes them.
	Apply(ctx context.Context, snap *lb.Snapshot, full bool) error
	// Cleanup removes the rules, also another process's.
	Cleanup(ctx context.Context) error
	// Frontends is how many LoadBalancer frontends the rules restrict.
	Frontends() int
}

// Source feeds the store until ctx ends (nil) or it fails.
type Source func(ctx context.Context, feed Feed) error

// Feed is what the daemon hands its source.
type Feed struct {
	Tracker *health.Tracker
	Changes *runner.Changes
	// Loaded records a load of services Service ports (err: a part of it
	// was rejected); the first sync waits for the first.
	Loaded func(services int, err error)
	// Rejected records a load that applied nothing: the Services before it
	// stay (services of them).
	Rejected func(services int)
}

// Run runs the daemon until ctx ends, the source fails or a successor has
// taken over, then drains and closes the mode.
func Run(ctx context.Context, cfg Config) error {
	log, reg, store, tracker := cfg.Logger, cfg.Registry, cfg.Store, cfg.Tracker
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	choice, m, unserved, err := choose(ctx, cfg)
	if err != nil {
		return err
	}
	succ := cfg.Succession
	inherited, err := succ.TakeOver(ctx, handover.TakeOverPatience)
	if err != nil {
		return err
	}
	cfg.Termination.Follow(succ)
	webInherited, hcInherited := map[string]*os.File{}, map[string]*os.File{}
	for name, f := range inherited {
		switch {
		case strings.HasPrefix(name, "http/"):
			webInherited[name] = f
		case strings.HasPrefix(name, healthcheck.SocketPrefix):
			hcInherited[name] = f
		default:
			continue
		}
		delete(inherited, name)
	}
	if hc := cfg.HealthChecks; hc != nil {
		hc.Inherit(hcInherited) // its first Sync takes them, or closes them
	} else {
		for _, f := range hcInherited {
			f.Close()
		}
	}
	mode, err := newMode(ctx, cfg, choice.Name, inherited)
	if err != nil {
		return err
	}
	if _, ok := mode.(proxymode.Handoverable); !ok {
		// A predecessor in the userspace mode handed over its listeners;
		// kept open here, they would hold its ports with no one accepting.
		for _, f := range inherited {
			f.Close()
		}
	}
	// SIGUSR2 is handled before the PID is published: sent as soon as the
	// file names this process, its default action would end it.
	succ.RestartOnSignal(ctx)
	if err := writePIDFile(cfg.PIDFile); err != nil {
		return err
	}
	var conns func() int64
	if a, ok := mode.(interface{ Active() int64 }); ok {
		conns = a.Active
	}
	memory := newMemoryReturner(reg, log, conns)
	go memory.Run(ctx)

	web := &httpServers{log: log, inherited: webInherited}
	web.serve("metrics", cfg.MetricsAddr, metricsHandler(reg, string(choice.Name)))
	web.serve("healthz", cfg.HealthzAddr, health.Handler(tracker, m.health))
	web.serve("profiling", cfg.ProfilingAddr, profilingHandler())
	// The syncer and the rule watcher stop, each with its own context,
	// once this process no longer serves: ctx lasts until Run returns,
	// which after a handover is when the process is terminated
	// (--successor-wait), and until then the rules are the successor's.
	syncCtx, stopSyncer := context.WithCancel(ctx)
	defer stopSyncer()
	watchCtx, stopWatching := context.WithCancel(ctx)
	defer stopWatching()
	syncerDone := make(chan struct{})
	// stopSyncing cancels a sync in flight and waits for it, so that no
	// sync writes rules after it returns. It is called only once the
	// syncer runs: by stopAccepting (a handover follows a sync) and after
	// the first load.
	stopSyncing := func() {
		stopWatching()
		stopSyncer()
		<-syncerDone
	}
	sockets, stopAccepting := handoverSockets(web, mode, cfg.HealthChecks, stopSyncing)
	newRunner := cfg.NewRunner
	if newRunner == nil {
		newRunner = func(sync func(context.Context, bool) error) *runner.Runner {
			return runner.New(sync, cfg.MinSyncPeriod, cfg.SyncPeriod)
		}
	}
	var syncer *runner.Runner
	if fw := cfg.Firewall; fw != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "svcproxy", Subsystem: "firewall", Name: "restricted_frontends",
			Help: "LoadBalancer IP, protocol and port triples whose sources loadBalancerSourceRanges restrict.",
		}, func() float64 { return float64(fw.Frontends()) }))
	}
	// A firewall that failed is tried again by an incremental sync (cheap
	// for the mode), one second later, then twice as late each time it
	// fails again, up to SyncPeriod: a kernel that cannot take it is not
	// retried, and logged about, every second.
	var fwBackoff time.Duration // the syncer goroutine's only
	fwDone := func(err error) {
		if err == nil {
			fwBackoff = 0
			return
		}
		m.firewallFailures.Inc()
		fwBackoff = min(max(2*fwBackoff, time.Second), max(cfg.SyncPeriod, time.Second))
		log.Error("writing the loadBalancerSourceRanges firewall failed; trying again", zap.Duration("in", fwBackoff), zap.Error(err))
		time.AfterFunc(fwBackoff, syncer.Trigger)
	}
	syncer = newSyncer(store, mode, cfg.Firewall, fwDone, m, tracker, newRunner, func(ctx context.Context, snap *lb.Snapshot) {
		unserved.check(snap)
		memory.Applied(snap)
		// The health checks take the sockets a predecessor handed over
		// before Serving offers this process's own to a successor; a port
		// the predecessor holds without having handed it over is free once
		// Serving has made it stop, so a failure is tried again then.
		var hcErr error
		hc := cfg.HealthChecks
		if hc != nil {
			hcErr = hc.Sync(snap)
		}
		succ.Serving(ctx, sockets, stopAccepting)
		if hcErr != nil {
			if err := hc.Sync(snap); err != nil {
				log.Warn("serving health-check node ports; retrying on the next sync", zap.Error(err))
			}
		}
		var gen uint64
		if g, ok := mode.(interface{ SocketsGeneration() uint64 }); ok {
			gen = g.SocketsGeneration()
		}
		if hc != nil {
			gen += hc.Generation() // both only grow: the sum changes when either does
		}
		succ.Deposit(ctx, sockets, gen)
	})
	// While a successor makes its first sync (it has the sockets, it has
	// not said it serves), the rules are becoming its own: a full sync
	// here (periodic, or a repair) would rewrite them with this process's,
	// which differ when the configuration does (an upgrade, a new node
	// IP). The runner syncs incrementally meanwhile (Service changes
	// still reach this process's data path; a mode that falls back to a
	// full sync by itself, after a failed one, still writes in full) and
	// makes the full sync owed if the successor fails (its teardown may
	// have removed the rules); after a handover it has stopped.
	syncer.Hold = succ.Handing
	syncer.OnSync = func(full bool, took time.Duration, err error) {
		if err != nil { // counted too (kubeproxy_sync_proxy_rules_*); retried
			log.Error("sync failed; retrying", zap.Bool("full", full), zap.Duration("took", took), zap.Error(err))
		}
	}
	changes := store.Subscribe() // before any source can publish
	go func() {
		for range changes {
			tracker.Queued()
			syncer.Trigger()
		}
	}()
	loaded, watchErr := startSource(ctx, cfg, m)
	select {
	case <-loaded:
		go func() {
			defer close(syncerDone)
			syncer.Run(syncCtx)
		}()
		if cfg.WatchRules != nil {
			changed := func() {
				m.rulesChanged.Inc()
				syncer.TriggerFull() // held while a successor writes its rules
			}
			if err := cfg.WatchRules(watchCtx, choice.Name, changed); err != nil {
				log.Info("rules changed by others are repaired at the periodic full sync only", zap.Error(err), zap.Duration("syncPeriod", cfg.SyncPeriod))
			}
		}
	case err := <-watchErr:
		return fmt.Errorf("loading services: %w", err)
	case <-ctx.Done():
		return nil
	}
	log.Info("svcproxy running", zap.Stringer("mode", choice), zap.String("steering", cfg.Steering), zap.String("metrics", cfg.MetricsAddr),
		zap.String("healthz", cfg.HealthzAddr), zap.String("connLog", cfg.ConnLog))

	handedOver := false
	select {
	case <-succ.HandedOver():
		handedOver = true
		log.Info("a successor took over: draining open connections, leaving the rules to it")
	case <-ctx.Done():
	case err = <-watchErr:
		if err != nil {
			cfg.Termination.Stop()
			stop()
			err = fmt.Errorf("loading services: %w", err)
		}
	}
	// From here the rules are the successor's (stopAccepting stopped the
	// syncs already, before the successor was told it serves), or about
	// to be removed: no sync may write them again.
	stopSyncing()
	log.Info("shutting down: no new connections; draining open ones", zap.Duration("drainTimeout", cfg.DrainTimeout))
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout+5*time.Second)
	defer cancel()
	web.shutdown(shutdownCtx)
	err = errors.Join(err, mode.Close(shutdownCtx, handedOver))
	if handedOver {
		cfg.Termination.Linger(ctx)
	}
	return err
}

// choose chooses the mode and whether it serves IPv6, registers the
// daemon's metrics for the families it programs, and warns about what
// does not fit: a fallback, an option the mode ignores, kube-proxy's rules.
func choose(ctx context.Context, cfg Config) (proxymode.Choice, *daemonMetrics, *unservedIPv6, error) {
	log := cfg.Logger
	choice, err := proxymode.Choose(ctx, cfg.Mode, cfg.Annotation, cfg.Modes)
	if err != nil {
		return choice, nil, nil, err
	}
	ipv6 := cfg.IPv6(ctx, choice.Name)
	m := newDaemonMetrics(cfg.Registry, Families(ipv6 == nil))
	m.mode.WithLabelValues(string(choice.Name), string(choice.Requested)).Set(1)
	if choice.Name != choice.Requested {
		log.Warn("proxy mode fell back", zap.Stringer("choice", choice))
	}
	warnKubeProxy(ctx, cfg.KubeProxy, log)
	return choice, m, newUnservedIPv6(ipv6, log), nil
}

// handoverSockets are what a successor takes over: the HTTP servers'
// sockets, the health-check node ports' (hc, if not nil) and the mode's if
// it can hand over. stopAccepting, once the successor is ready and before
// it is told it serves, stops the syncs (stopSyncing), then the mode
// accepting and hc serving.
func handoverSockets(web *httpServers, mode proxymode.Mode, hc *healthcheck.Server, stopSyncing func()) (sockets func() (map[string]*os.File, error), stopAccepting func()) {
	h, _ := mode.(proxymode.Handoverable)
	sockets = func() (map[string]*os.File, error) {
		files := map[string]*os.File{}
		closeAll := func() {
			for _, f := range files {
				f.Close()
			}
		}
		if h != nil {
			mf, err := h.Sockets()
			if err != nil {
				return nil, err
			}
			maps.Copy(files, mf)
		}
		if hc != nil {
			hf, err := hc.Sockets()
			if err != nil {
				closeAll()
				return nil, err
			}
			maps.Copy(files, hf)
		}
		return web.sockets(files)
	}
	stopAccepting = func() {
		stopSyncing()
		if h != nil {
			h.StopAccepting()
		}
		if hc != nil {
			hc.HandOver()
		}
	}
	return sockets, stopAccepting
}

// startSource runs the source. loaded is closed at its first load: the
// first sync waits for it, as kube-proxy waits for its informers (an empty
// first sync would drop every Service, and tell a predecessor to stop
// while serving nothing). watchErr gets what the source returned.
func startSource(ctx context.Context, cfg Config, m *daemonMetrics) (loaded <-chan struct{}, watchErr <-chan error) {
	first, once := make(chan struct{}), sync.Once{}
	feed := Feed{Tracker: cfg.Tracker, Changes: m.changes,
		Loaded: func(services int, err error) {
			once.Do(func() { close(first) })
			m.services.Set(float64(services))
			if err != nil {
				m.sourceErrors.Inc()
			}
		},
		Rejected: func(services int) {
			m.services.Set(float64(services))
			m.sourceErrors.Inc()
		},
	}
	errc := make(chan error, 1)
	go func() { errc <- cfg.Source(ctx, feed) }()
	return first, errc
}

// newMode builds the chosen mode, after removing what other modes may
// have left installed (switching modes must not leave two sets of rules
// fighting over the same traffic): unless it is the userspace mode without
// steering, which changes nothing on the node.
func newMode(ctx context.Context, cfg Config, name proxymode.Name, inherited map[string]*os.File) (proxymode.Mode, error) {
	if cfg.Steering == "redirect" || cfg.Steering == "local" || name != proxymode.Userspace {
		if err := cfg.Modes.Cleanup(ctx, name); err != nil {
			return nil, err
		}
	}
	return cfg.Modes.New(ctx, name, inherited)
}

// writePIDFile writes this process's PID to path, if set; a successor
// overwrites it.
func writePIDFile(path string) error {
	if path == "" {
		return nil
	}
	if err := os.WriteFile(path, []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("--pid-file: %w", err)
	}
	return nil
}
