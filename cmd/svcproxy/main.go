// Command svcproxy is the node daemon: it feeds Services from a source into
// the load-balancer store and carries every snapshot to the proxy mode. It
// only wires packages together; each of them owns its own part.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/svcproxy/svcproxy/connlog"
	"github.com/svcproxy/svcproxy/examples"
	"github.com/svcproxy/svcproxy/health"
	"github.com/svcproxy/svcproxy/healthcheck"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/proxymode"
	"github.com/svcproxy/svcproxy/source/file"
	"github.com/svcproxy/svcproxy/source/kube"
)

func main() {
	opts, err := parseFlags(os.Args[1:], hostEnvironment())
	switch {
	case errors.Is(err, flag.ErrHelp):
		return
	case errors.Is(err, errVersion):
		fmt.Println(readBuildInfo())
		return
	case err != nil:
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
	for _, w := range o.warnings {
		log.Warn(w)
	}
	if o.check {
		return check(o, os.Stdout)
	}
	if o.initOnly {
		log.Info("--init-only: svcproxy needs no privileged initialisation step; exiting")
		return nil
	}
	if err := setOOMScoreAdj("/proc/self/oom_score_adj", o.oomScoreAdj); err != nil {
		log.Warn("leaving oom_score_adj as it is", zap.Error(err))
	}
	disableTHP(log)

	ctx, stop, term := notifyTermination(o.successorWait, log)
	defer stop()

	if o.cleanup {
		return cleanup(ctx, o, log)
	}
	if o.writeConfigTo != "" {
		return writeConfig(o, o.writeConfigTo)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerBuildInfo(reg, readBuildInfo())

	var kubeClient kubernetes.Interface
	var node *corev1.Node
	zone := o.zone // without --zone, the Node's label, followed live by the kube source
	if o.kubeconfig != "" || o.master != "" || o.inCluster {
		kube.RegisterRESTClientMetrics(reg)
		if kubeClient, err = kube.NewClient(kube.ClientConfig{Kubeconfig: o.kubeconfig, Master: o.master,
			QPS: o.kubeAPIQPS, Burst: o.kubeAPIBurst, ContentType: o.kubeAPIContentType}); err != nil {
			return err
		}
		nctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		node, err = kube.WaitForNode(nctx, kubeClient, o.hostname, log)
		cancel()
		if err != nil {
			log.Warn("carrying on without this node's Node object: no zone, no proxy-mode annotation", zap.Error(err))
		}
		if zone == "" {
			zone = kube.Zone(node)
		}
	}
	if w := o.resolvePrimary(node); w != "" {
		log.Warn(w)
	}
	store := lb.NewStore(lb.StoreOptions{
		Node:             lb.Node{Name: o.hostname, Zone: zone},
		DefaultAlgorithm: o.algorithm,
	})

	// The services file's first load, before anything starts and above all
	// before taking over from a running svcproxy: a file with problems ends
	// this one, listing them all, and leaves a running one be. (Run does
	// not parse the same content again.)
	watcher := &file.Watcher{Path: o.services, Data: examples.Services, Store: store, Logger: log}
	var reloads *reloadMetrics
	if kubeClient == nil {
		reloads = newReloadMetrics(reg)
		watcher.OnReload = func(_ int, err error) { reloads.loaded(err, time.Now()) }
		if err := watcher.Reload(); err != nil {
			return fmt.Errorf("nothing started (svcproxy --check lists the same problems): %w", err)
		}
	}

	var clog *connlog.Log
	if o.connLog != "" {
		clog, err = connlog.Open(connlog.Options{Path: o.connLog, SampleEvery: o.connLogSample})
		if err != nil {
			return fmt.Errorf("--conn-log: %w (use --conn-log=- for stdout or --conn-log= to turn it off)", err)
		}
		defer clog.Close()
	}

	choice, err := proxymode.Choose(ctx, o.proxyMode, kube.ProxyMode(node), probes(o, log))
	if err != nil {
		return err
	}
	unserved := newUnservedIPv6(detectIPv6(ctx, hostIPv6, choice.Mode, o, log), log)
	m := newDaemonMetrics(reg, ipFamilies(o))
	m.mode.WithLabelValues(string(choice.Mode), string(choice.Requested)).Set(1)
	if choice.Mode != choice.Requested {
		log.Warn("proxy mode fell back", zap.Stringer("choice", choice))
	}
	if choice.Mode != proxymode.Userspace && o.udpIdleTimeout != 0 {
		log.Warn("conntrack.udpTimeout (--conntrack-udp-timeout) ignored: the kernel modes leave the kernel's conntrack timeouts as they are", zap.Stringer("mode", choice))
	}
	warnKubeProxy(ctx, hostKubeProxyTraces(), log)
	succ, inherited, err := takeOver(ctx, o.handoverSocket, takeOverPatience, log)
	if err != nil {
		return err
	}
	term.follow(succ)
	webInherited := map[string]*os.File{}
	for name, f := range inherited {
		if strings.HasPrefix(name, "http/") {
			webInherited[name] = f
			delete(inherited, name)
		}
	}
	dp, err := newDataplane(ctx, choice.Mode, o, reg, log, clog, inherited)
	if err != nil {
		return err
	}
	if err := writePIDFile(o.pidFile); err != nil {
		return err
	}
	startSuccessorOnSIGUSR2(ctx, log)
	var conns func() int64
	if u, ok := dp.(*userspace); ok {
		conns = u.fwd.Active
	}
	memory := newMemoryReturner(reg, log, conns)
	go memory.Run(ctx)

	tracker := health.NewTracker(2*o.syncPeriod, nil)
	web := &httpServers{log: log, inherited: webInherited}
	web.serve("metrics", o.metricsAddr, metricsHandler(reg, string(choice.Mode)))
	web.serve("healthz", o.healthzAddr, health.Handler(tracker, m.health))
	web.serve("profiling", o.profilingAddr, profilingHandler())
	sockets := func() (map[string]*os.File, error) { return web.sockets(nil) }
	stopAccepting := func() {}
	if h, ok := dp.(handoverable); ok {
		sockets = func() (map[string]*os.File, error) {
			files, err := h.Sockets()
			if err != nil {
				return nil, err
			}
			return web.sockets(files)
		}
		stopAccepting = h.StopAccepting
	}
	// Health-check node ports follow the applied snapshots (only Kubernetes
	// Services have them).
	var hc *healthcheck.Server
	if kubeClient != nil {
		hc = healthcheck.New(healthcheck.Config{Healthy: func() bool { return tracker.Status().Healthy }, Logger: log})
		defer hc.Close()
	}
	syncer := newSyncer(store, dp, m, tracker, o.minSyncPeriod, o.syncPeriod, func(ctx context.Context, snap *lb.Snapshot) {
		if hc != nil {
			if err := hc.Sync(snap); err != nil {
				log.Warn("serving health-check node ports; retrying on the next sync", zap.Error(err))
			}
		}
		unserved.check(snap)
		memory.Applied(snap)
		succ.serving(ctx, sockets, stopAccepting)
	})
	changes := store.Subscribe() // before any source can publish
	go func() {
		for range changes {
			tracker.Queued()
			syncer.Trigger()
		}
	}()

	// The first sync waits for the source's first load, as kube-proxy waits
	// for its informers: an empty first sync would drop every Service (and
	// tell a predecessor to stop while serving nothing).
	loaded, loadedOnce := make(chan struct{}), sync.Once{}
	sourceLoaded := func(services int, err error) {
		loadedOnce.Do(func() { close(loaded) })
		m.services.Set(float64(services))
		if err != nil {
			m.sourceErrors.Inc()
		}
	}
	if kubeClient == nil {
		watcher.OnReload = func(services int, err error) {
			reloads.loaded(err, time.Now())
			if err != nil { // nothing applied: the Services before stay
				m.services.Set(float64(services))
				m.sourceErrors.Inc()
				return
			}
			sourceLoaded(services, nil)
		}
		sourceLoaded(store.Snapshot().Len(), nil) // the first load, above
	}
	if o.services == "" && kubeClient == nil {
		log.Info("no --services given: serving the embedded example services file")
	}
	watchErr := make(chan error, 1)
	if kubeClient != nil {
		go func() {
			watchErr <- kube.Run(ctx, kube.Options{Client: kubeClient, NodeName: o.hostname, Zone: o.zone, ProxyName: o.proxyName,
				ResyncPeriod: o.configSyncPeriod, Logger: log, Metrics: kube.NewMetrics(reg), Health: tracker,
				Changes: m.changes, OnSync: sourceLoaded}, store)
		}()
	} else {
		go func() { watchErr <- watcher.Run(ctx) }()
	}

	select {
	case <-loaded:
		go syncer.Run(ctx)
	case err := <-watchErr:
		return fmt.Errorf("loading services: %w", err)
	case <-ctx.Done():
		return nil
	}
	log.Info("svcproxy running", zap.Stringer("mode", choice), zap.String("steering", o.steering), zap.String("metrics", o.metricsAddr),
		zap.String("healthz", o.healthzAddr), zap.String("connLog", o.connLog))

	handedOver := false
	select {
	case <-succ.handedOver:
		handedOver = true
		log.Info("a successor took over: draining open connections, leaving the rules to it")
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
	web.shutdown(shutdownCtx)
	err = errors.Join(err, dp.Shutdown(shutdownCtx, handedOver))
	if handedOver {
		term.linger(ctx)
	}
	return err
}

// cleanup removes everything svcproxy installs, whichever mode installed it,
// unless a running svcproxy owns it (and not --force).
func cleanup(ctx context.Context, o *options, log *zap.Logger) error {
	if err := guardCleanup(ctx, newOwner(o), o.force, log); err != nil {
		return err
	}
	if err := cleanupModes(ctx, "", o, log); err != nil {
		return err
	}
	log.Info("removed every svcproxy rule and set")
	return nil
}

// setOOMScoreAdj writes adj, if set, to path (/proc/self/oom_score_adj).
func setOOMScoreAdj(path string, adj *int) error {
	if adj == nil {
		return nil
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(*adj)), 0); err != nil {
		return fmt.Errorf("setting oom_score_adj to %d: %w", *adj, err)
	}
	return nil
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
