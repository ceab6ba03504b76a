// Command svcproxy is the node daemon: it feeds Services from a source into
// the load-balancer store and carries every snapshot to the proxy mode. It
// only wires packages together; each of them owns its own part.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/connlog"
	"github.com/svcproxy/svcproxy/examples"
	"github.com/svcproxy/svcproxy/forwarder"
	"github.com/svcproxy/svcproxy/health"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/redirect"
	"github.com/svcproxy/svcproxy/runner"
	"github.com/svcproxy/svcproxy/source/file"
)

func main() {
	opts, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "svcproxy:", err)
		os.Exit(2)
	}
	if err := run(opts); err != nil {
		fmt.Fprintln(os.Stderr, "svcproxy:", err)
		os.Exit(1)
	}
}

func run(o *options) error {
	log, err := newLogger(o.logLevel, o.logFormat)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // stderr

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	if o.cleanup {
		return cleanup(ctx, log)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := newDaemonMetrics(reg)

	store := lb.NewStore(lb.StoreOptions{
		Node:             lb.Node{Name: o.hostname, Zone: o.zone},
		DefaultAlgorithm: o.algorithm,
	})

	var clog *connlog.Log
	if o.connLog != "" {
		clog, err = connlog.Open(connlog.Options{Path: o.connLog, SampleEvery: o.connLogSample})
		if err != nil {
			return fmt.Errorf("--conn-log: %w (use --conn-log=- for stdout or --conn-log= to turn it off)", err)
		}
		defer clog.Close()
	}

	steer := o.steering == "redirect"
	fcfg := forwarder.Config{
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
		Metrics:            forwarder.NewMetrics(reg),
	}
	var red *redirect.Redirector
	if steer {
		fcfg.Redirect = []netip.AddrPort{netip.AddrPortFrom(netip.IPv4Unspecified(), o.redirectPort)}
		red, err = redirect.New(redirect.Config{Mark: uint32(o.mark), NodePortAddresses: o.nodePortAddresses, Logger: log})
		if err != nil {
			return err
		}
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "svcproxy", Subsystem: "redirect", Name: "repairs_total",
			Help: "Full syncs that found svcproxy's rules or sets tampered with and repaired them.",
		}, func() float64 { return float64(red.Repairs()) }))
		log.Info("steering with iptables REDIRECT", zap.String("iptables", red.Backend()), zap.Uint16("redirectPort", o.redirectPort))
	}
	fwd, err := forwarder.New(fcfg)
	if err != nil {
		return err
	}

	tracker := health.NewTracker(2*o.syncPeriod, nil)
	sync := runner.New(func(ctx context.Context, full bool) error {
		snap := store.Snapshot()
		if err := fwd.Apply(ctx, snap); err != nil {
			log.Warn("applied snapshot with errors", zap.Uint64("version", snap.Version), zap.Error(err))
		}
		if red != nil {
			ports := redirect.Ports{TCP: o.redirectPort, UDP: fwd.UDPPorts()}
			if err := red.Apply(ctx, snap, ports, full); err != nil {
				return fmt.Errorf("steering snapshot %d: %w", snap.Version, err)
			}
		}
		m.networkProgramming.Observe(time.Since(snap.Time).Seconds())
		tracker.Applied()
		return nil
	}, o.minSyncPeriod, o.syncPeriod)
	sync.OnSync = func(full bool, took time.Duration, err error) {
		m.syncDuration.Observe(took.Seconds())
		m.lastSync.SetToCurrentTime()
	}
	go func() {
		for range store.Subscribe() {
			tracker.Queued()
			sync.Trigger()
		}
	}()

	watcher := &file.Watcher{Path: o.services, Data: examples.Services, Store: store, Logger: log,
		OnReload: func(services int, err error) {
			m.services.Set(float64(services))
			if err != nil {
				m.sourceErrors.Inc()
			}
		}}
	if o.services == "" {
		log.Info("no --services given: serving the embedded example services file")
	}
	watchErr := make(chan error, 1)
	go func() { watchErr <- watcher.Run(ctx) }()

	servers := []*http.Server{
		serve(log, "metrics", o.metricsAddr, promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})),
		serve(log, "healthz", o.healthzAddr, health.Handler(tracker)),
	}
	go sync.Run(ctx)
	log.Info("svcproxy running", zap.String("mode", "userspace"), zap.String("steering", o.steering), zap.String("metrics", o.metricsAddr),
		zap.String("healthz", o.healthzAddr), zap.String("connLog", o.connLog))

	select {
	case <-ctx.Done():
	case err = <-watchErr:
		if err != nil {
			stop()
			err = fmt.Errorf("loading services: %w", err)
		}
	}
	log.Info("shutting down: no new connections; draining open ones", zap.Duration("drainTimeout", o.drainTimeout))
	shutdownCtx, cancel := context.WithTimeout(context.Background(), o.drainTimeout+5*time.Second)
	defer cancel()
	for _, s := range servers {
		_ = s.Shutdown(shutdownCtx)
	}
	err = errors.Join(err, fwd.Shutdown(shutdownCtx))
	if red != nil {
		// After the drain: meanwhile, new connections to Services are
		// refused at once by the closed redirect port, not blackholed.
		if cerr := red.Cleanup(shutdownCtx); cerr != nil {
			err = errors.Join(err, fmt.Errorf("removing steering rules: %w", cerr))
		} else {
			log.Info("removed steering rules")
		}
	}
	return err
}

// cleanup removes everything svcproxy installs, whichever mode installed it.
func cleanup(ctx context.Context, log *zap.Logger) error {
	red, err := redirect.New(redirect.Config{Mark: forwarder.DefaultMark, Logger: log})
	if err != nil {
		return err
	}
	if err := red.Cleanup(ctx); err != nil {
		return fmt.Errorf("removing redirect rules: %w", err)
	}
	log.Info("removed every svcproxy rule and set")
	return nil
}

// serve starts an HTTP server for handler on addr; an empty addr disables it.
func serve(log *zap.Logger, name, addr string, handler http.Handler) *http.Server {
	s := &http.Server{Addr: addr, Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	if addr == "" {
		return s
	}
	go func() {
		if err := s.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server failed", zap.String("server", name), zap.String("address", addr), zap.Error(err))
		}
	}()
	return s
}
