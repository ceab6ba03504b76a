// Command svcproxy is the node daemon: it feeds Services from a source into
// the load-balancer store and carries every snapshot to the proxy mode. It
// only wires packages together; each of them owns its own part.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/svcproxy/svcproxy/connlog"
	"github.com/svcproxy/svcproxy/daemon"
	"github.com/svcproxy/svcproxy/examples"
	"github.com/svcproxy/svcproxy/firewall"
	"github.com/svcproxy/svcproxy/handover"
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

// run is flags → configuration → daemon.Run: it sets the process up,
// builds the store and the source, and hands them to the daemon with the
// modes the options configure.
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
		tune(o, hostTuner(), log)
		log.Info("--init-only: done; exiting")
		return nil
	}
	if err := daemon.SetOOMScoreAdj("/proc/self/oom_score_adj", o.oomScoreAdj); err != nil {
		log.Warn("leaving oom_score_adj as it is", zap.Error(err))
	}
	daemon.DisableTHP(log)

	ctx, stop, term := handover.NotifyTermination(o.successorWait, log)
	defer stop()

	reg := prometheus.NewRegistry()
	if o.cleanup {
		return daemon.Cleanup(ctx, modes(o, reg, log, nil), firewall.New(firewall.Config{Kernel: firewall.Netlink("")}), o.handoverSocket, o.pidFile, o.force, log)
	}
	if o.writeConfigTo != "" {
		return writeConfig(o, o.writeConfigTo)
	}
	keeper := keeperFromMaster()
	if o.masterWorker && keeper == "" {
		stop()
		return runMaster(o, log)
	}
	tune(o, hostTuner(), log) // by the worker, not the master: once per process that serves
	if keeper != "" {
		o.pidFile = "" // the master's
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerBuildInfo(reg, readBuildInfo())
	if keeper != "" {
		registerWorkerRestarts(reg, log)
	}

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
	local, err := hostAddrs()
	if err != nil {
		log.Warn("steering with REDIRECT, not a DNAT to the node's address", zap.Error(err))
	}
	o.steerTo = o.steerAddrs(node, local)
	succession := handover.NewSuccession(o.handoverSocket, handover.OS{}, log).WithKeeper(keeper)
	store := lb.NewStore(lb.StoreOptions{
		Node:             lb.Node{Name: o.hostname, Zone: zone},
		DefaultAlgorithm: o.algorithm,
	})
	tracker := health.NewTracker(2*o.syncPeriod, nil)

	// Health-check node ports follow the applied snapshots, whichever the
	// source (the services file's healthCheckNodePort, the API's).
	hc := healthcheck.New(healthcheck.Config{Healthy: func() bool { return tracker.Status().Healthy }, Logger: log})
	defer hc.Close()
	var source daemon.Source
	if kubeClient == nil {
		// The services file's first load, before anything starts and above
		// all before taking over from a running svcproxy: a file with
		// problems ends this one, listing them all, and leaves a running
		// one be. (Run does not parse the same content again.)
		watcher := &file.Watcher{Path: o.services, Data: examples.Services, Store: store, Logger: log}
		reloads := daemon.NewReloadMetrics(reg)
		watcher.OnReload = func(_ int, err error) { reloads.Loaded(err, time.Now()) }
		if err := watcher.Reload(); err != nil {
			return fmt.Errorf("nothing started (svcproxy --check lists the same problems): %w", err)
		}
		source = daemon.FileSource(watcher, reloads, o.services == "")
	} else {
		source = daemon.KubeSource(kube.Options{Client: kubeClient, NodeName: o.hostname, Zone: o.zone, ProxyName: o.proxyName,
			ResyncPeriod: o.configSyncPeriod, Logger: log, Metrics: kube.NewMetrics(reg),
			OnNode: restartOnNewSteerAddrs(o, log, hostAddrs, succession.Restart)}, store)
		// SIGHUP reloads the services file; with the API server as the
		// source there is nothing to reload, and the signal must not end
		// the process (Go's default), which --master-worker would count
		// as a crash.
		defer ignoreHangup(log)()
	}

	var clog *connlog.Log
	if o.connLog != "" {
		clog, err = connlog.Open(connlog.Options{Path: o.connLog, SampleEvery: o.connLogSample})
		if err != nil {
			return fmt.Errorf("--conn-log: %w (use --conn-log=- for stdout or --conn-log= to turn it off)", err)
		}
		defer clog.Close()
	}

	return daemon.Run(ctx, daemon.Config{
		Logger: log, Registry: reg, Store: store, Source: source, Tracker: tracker, HealthChecks: hc,
		Modes: modes(o, reg, log, clog), Mode: o.proxyMode,
		Firewall: firewall.New(firewall.Config{Kernel: firewall.Netlink(""), IPv6: func() bool { return o.ipv6 }, NodeIPs: kube.PrimaryIPs(node, o.bindAddress)}), Annotation: kube.ProxyMode(node), Steering: o.steering,
		IPv6: func(ctx context.Context, mode proxymode.Name) error {
			return detectIPv6(ctx, daemon.HostIPv6, hostNFTSteering(o), mode, o, log)
		},
		KubeProxy:     daemon.HostKubeProxyTraces(),
		Succession:    succession,
		Termination:   term,
		MinSyncPeriod: o.minSyncPeriod, SyncPeriod: o.syncPeriod, DrainTimeout: o.drainTimeout,
		MetricsAddr: o.metricsAddr, HealthzAddr: o.healthzAddr, ProfilingAddr: o.profilingAddr,
		ConnLog: o.connLog, PIDFile: o.pidFile,
		WatchRules: func(ctx context.Context, mode proxymode.Name, changed func()) error {
			return watchRules(ctx, mode, o, changed)
		},
	})
}

// restartOnNewSteerAddrs is the kube source's OnNode with --steering=redirect
// (nil otherwise): when the addresses steering DNATs to (steerAddrs) would
// now be others (the Node's InternalIP changed, or arrived late, or one
// stopped being this host's), svcproxy asks for a restart (restart): the
// successor takes over without losing a connection and steers to the new
// addresses. Left alone, steering would go on sending Service traffic to
// an address that may now be another host's. kube-proxy exits when its
// node's IPs change, for the same reason. It asks again at a later Node
// update only if restartRetry has passed (the restart did not happen: a
// master busy with another restart ignores the request), and does nothing
// while the userspace mode does not steer with REDIRECT (a kernel mode
// chosen by the Node's annotation) or when the host's addresses cannot be
// read.
func restartOnNewSteerAddrs(o *options, log *zap.Logger, local func() ([]netip.Addr, error), restart func() error) func(*corev1.Node) {
	if o.steering != "redirect" {
		return nil
	}
	var asked atomic.Int64 // unix nanoseconds of the last request; 0: none
	return func(node *corev1.Node) {
		if o.steeredBy == "" { // set when the userspace mode is built, before the source runs
			return
		}
		addrs, err := local()
		if err != nil {
			return
		}
		next := o.steerAddrs(node, addrs)
		if slices.Equal(next, o.steerTo) {
			return
		}
		now := time.Now().UnixNano()
		if last := asked.Load(); last != 0 && time.Duration(now-last) < restartRetry || !asked.CompareAndSwap(last, now) {
			return
		}
		log.Warn("this node's primary IPs changed: restarting, so that steering DNATs to the new ones",
			zap.Stringers("steering to", o.steerTo), zap.Stringers("primary IPs now", next))
		if err := restart(); err != nil {
			log.Error("cannot restart: steering DNATs to the old addresses until svcproxy is restarted", zap.Error(err))
		}
	}
}

// restartRetry is how long restartOnNewSteerAddrs waits for a restart it
// asked for before it asks again.
const restartRetry = 2 * time.Minute

// hostAddrs lists this host's addresses, on every interface (a node's
// primary IP may sit on lo).
func hostAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("listing this host's addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out, nil
}

// ignoreHangup logs SIGHUP instead of dying of it, until the returned
// func is called.
func ignoreHangup(log *zap.Logger) (stop func()) {
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-hups:
				log.Info("SIGHUP: nothing to reload (the Services come from the API server)")
			case <-done:
				return
			}
		}
	}()
	return func() { signal.Stop(hups); close(done) }
}
