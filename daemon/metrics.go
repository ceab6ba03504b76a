package daemon

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/svcproxy/svcproxy/health"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/proxymode"
	"github.com/svcproxy/svcproxy/runner"
)

// daemonMetrics are the daemon's metrics: the sync loop's (runner.Metrics:
// kube-proxy's kubeproxy_sync_proxy_rules_* and svcproxy_sync_*), the
// changes followed to the sync that programs them, the health endpoints',
// and svcproxy's own below.
type daemonMetrics struct {
	sync     *runner.Metrics
	changes  *runner.Changes
	health   *health.Metrics
	families []string // the ip_family label values: the families the mode programs

	networkProgramming prometheus.Histogram
	services           prometheus.Gauge
	sourceErrors       prometheus.Counter
	rulesChanged       prometheus.Counter
	firewallFailures   prometheus.Counter
	mode               *prometheus.GaugeVec

	programmed uint64 // the newest snapshot version synced; the sync loop's only
}

// newDaemonMetrics registers the daemon's metrics; families are the IP
// families the mode programs (Families).
func newDaemonMetrics(reg prometheus.Registerer, families []string) *daemonMetrics {
	syncMetrics := runner.NewMetrics(reg, families...)
	m := &daemonMetrics{
		sync:     syncMetrics,
		changes:  runner.NewChanges(syncMetrics, nil),
		health:   health.NewMetrics(reg),
		families: families,
		networkProgramming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "svcproxy", Name: "network_programming_duration_seconds",
			Help:    "From a change reaching the load-balancer store to the proxy mode serving it.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 20),
		}),
		services: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "svcproxy", Subsystem: "source", Name: "service_ports",
			Help: "Service ports the load-balancer store holds.",
		}),
		sourceErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "svcproxy", Subsystem: "source", Name: "load_errors_total",
			Help: "Loads of the services source that rejected some or all of it.",
		}),
		rulesChanged: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "svcproxy", Name: "rules_changed_by_others_total",
			Help: "Notifications that another process changed the mode's rules (nf_tables); each asks for a full sync at once.",
		}),
		firewallFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "svcproxy", Subsystem: "firewall", Name: "sync_failures_total",
			Help: "Syncs whose loadBalancerSourceRanges firewall could not be written (the mode was synced all the same); tried again a second later, backing off to --sync-period.",
		}),
		mode: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "svcproxy", Name: "proxy_mode",
			Help: "1 for the proxy mode running, with the mode asked for (they differ after a fallback).",
		}, []string{"mode", "requested"}),
	}
	reg.MustRegister(m.mode, m.networkProgramming, m.services, m.sourceErrors, m.rulesChanged, m.firewallFailures)
	return m
}

// ReloadMetrics count the loads of the services file, named as
// Prometheus' own prometheus_config_*: a failed load applies nothing.
type ReloadMetrics struct {
	reloads     *prometheus.CounterVec
	successful  prometheus.Gauge
	lastSuccess prometheus.Gauge
}

// NewReloadMetrics registers the services file's load metrics.
func NewReloadMetrics(reg prometheus.Registerer) *ReloadMetrics {
	m := &ReloadMetrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "svcproxy", Subsystem: "config", Name: "reloads_total",
			Help: "Loads of the services file (at start, on SIGHUP, on a change), by result; a failure applies nothing and keeps the previous Services.",
		}, []string{"result"}),
		successful: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "svcproxy", Subsystem: "config", Name: "last_reload_successful",
			Help: "1 if the last load of the services file was applied, 0 if it was rejected (the Services before it are served).",
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "svcproxy", Subsystem: "config", Name: "last_reload_success_timestamp_seconds",
			Help: "When the services file was last applied, in seconds since the epoch.",
		}),
	}
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("failure")
	reg.MustRegister(m.reloads, m.successful, m.lastSuccess)
	return m
}

// Loaded records a load of the services file at now and its error.
func (m *ReloadMetrics) Loaded(err error, now time.Time) {
	if err != nil {
		m.reloads.WithLabelValues("failure").Inc()
		m.successful.Set(0)
		return
	}
	m.reloads.WithLabelValues("success").Inc()
	m.successful.Set(1)
	m.lastSuccess.Set(float64(now.UnixNano()) / 1e9)
}

// RegisterRestoreFailures exports a mode's failed iptables-restore runs as
// kube-proxy's kubeproxy_sync_proxy_rules_iptables_restore_failures_total,
// one series per programmed ip_family, with its help text. kube-proxy
// counts them in its iptables and IPVS modes; svcproxy also in the
// userspace mode's REDIRECT steering, which writes its rules the same way.
func RegisterRestoreFailures(reg prometheus.Registerer, families []string, failures func(netfilter.Family) uint64) {
	registerFamilyCounter(reg, "sync_proxy_rules_iptables_restore_failures_total", "Cumulative proxy iptables restore failures", families, failures)
}

// RegisterNFTablesSyncFailures exports the nftables mode's failed
// transactions as kube-proxy's nftables mode does,
// kubeproxy_sync_proxy_rules_nftables_sync_failures_total per ip_family.
func RegisterNFTablesSyncFailures(reg prometheus.Registerer, families []string, failures func(netfilter.Family) uint64) {
	registerFamilyCounter(reg, "sync_proxy_rules_nftables_sync_failures_total", "Cumulative proxy nftables sync failures", families, failures)
}

func registerFamilyCounter(reg prometheus.Registerer, name, help string, families []string, count func(netfilter.Family) uint64) {
	for _, fam := range families {
		f := netfilter.IPv4
		if fam == runner.IPv6 {
			f = netfilter.IPv6
		}
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Subsystem: "kubeproxy", Name: name, Help: help,
			ConstLabels: prometheus.Labels{"ip_family": fam},
		}, func() float64 { return float64(count(f)) }))
	}
}

// RegisterRepairs exports a mode's count of full syncs that repaired
// tampering as svcproxy_<subsystem>_repairs_total, with help.
func RegisterRepairs(reg prometheus.Registerer, subsystem, help string, repairs func() uint64) {
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "svcproxy", Subsystem: subsystem, Name: "repairs_total", Help: help,
	}, func() float64 { return float64(repairs()) }))
}

// RegisterUnservedCleared exports a mode's count of conntrack entries
// deleted because their packets reached a Service IP before it was served
// (conntrack.Served.Clear).
func RegisterUnservedCleared(reg prometheus.Registerer, cleared func() uint64) {
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "svcproxy", Subsystem: "conntrack", Name: "unserved_entries_deleted_total",
		Help: "Conntrack entries deleted because their packets reached a Service IP before it was served (not NATed: UDP, and TCP in SYN_SENT), when it started being served.",
	}, func() float64 { return float64(cleared()) }))
}

// RegisterConntrackDeleted exports the conntrack entries a mode deleted,
// per family, as kube-proxy's
// kubeproxy_conntrack_reconciler_deleted_entries_total: kube-proxy counts
// the UDP entries its reconciler deletes (not DNATed to a serving
// endpoint); svcproxy's modes count those (a removed endpoint's flows,
// flows that reached a frontend before it was served) and the TCP ones in
// SYN_SENT that met no rule, and REDIRECT steering a moved UDP frontend's.
func RegisterConntrackDeleted(reg prometheus.Registerer, families []string, deleted func(netfilter.Family) uint64) {
	registerFamilyCounter(reg, "conntrack_reconciler_deleted_entries_total", "Cumulative conntrack flows deleted by conntrack reconciler", families, deleted)
}

// Families are the IP families the modes program, as kube-proxy's
// ip_family label values: IPv4, and IPv6 when the node serves it.
func Families(ipv6 bool) []string {
	if ipv6 {
		return []string{runner.IPv4, runner.IPv6}
	}
	return []string{runner.IPv4}
}

// synced records what a successful sync of snap programmed: each change it
// carried (network programming latency, pending changes), svcproxy's
// store-to-served latency once per snapshot, and the Services with a Local
// policy and no local endpoints.
func (m *daemonMetrics) synced(snap *lb.Snapshot) {
	m.changes.Programmed(snap.Version)
	if snap.Version > m.programmed {
		m.networkProgramming.Observe(time.Since(snap.Time).Seconds())
		m.programmed = snap.Version
	}
	for _, fam := range m.families {
		internal, external := noLocalEndpoints(snap, fam)
		m.sync.SetNoLocalEndpoints(fam, internal, external)
	}
}

// newSyncer returns the sync loop (built by newRunner) that carries
// store's snapshots to fw (nil: none), then dp. After each successful sync
// it records what was programmed, tells the health tracker and calls
// served with the snapshot (nil: nothing); a failed sync is counted and
// retried by the runner, and moves neither. The firewall failing is not
// the sync failing: fwDone hears of each firewall Apply (nil: it worked)
// and schedules the firewall's retries, while dp, the health checks and a
// handover carry on; a failing firewall must not hold every Service's
// changes back, nor make the runner sync the mode in full every second.
func newSyncer(store *lb.Store, dp proxymode.Mode, fw Firewall, fwDone func(error), m *daemonMetrics, tracker *health.Tracker, newRunner func(sync func(context.Context, bool) error) *runner.Runner, served func(context.Context, *lb.Snapshot)) *runner.Runner {
	r := newRunner(func(ctx context.Context, full bool) error {
		snap := store.Snapshot()
		if fw != nil {
			err := fw.Apply(ctx, snap, full)
			if err != nil {
				err = fmt.Errorf("applying snapshot %d: %w", snap.Version, err)
			}
			fwDone(err)
		}
		if err := dp.Apply(ctx, snap, full); err != nil {
			return fmt.Errorf("applying snapshot %d: %w", snap.Version, err)
		}
		m.synced(snap)
		tracker.Applied()
		if served != nil {
			served(ctx, snap)
		}
		return nil
	})
	r.Metrics = m.sync
	return r
}

// noLocalEndpoints counts, as kube-proxy's
// kubeproxy_sync_proxy_rules_no_local_endpoints_total does, the Service
// ports with usable endpoints of family somewhere but, under a Local
// policy, none on this node: for ClusterIP traffic (internal) and, when
// the Service is reachable from outside, external traffic.
func noLocalEndpoints(snap *lb.Snapshot, family string) (internal, external int) {
	inFamily := func(a netip.Addr) bool { return a.Unmap().Is4() == (family == runner.IPv4) }
	for _, b := range snap.Balancers() {
		svc := b.Service
		usable := false
		for _, ep := range svc.Endpoints {
			if inFamily(ep.Addr.Addr()) && (ep.Ready || ep.Serving && ep.Terminating) {
				usable = true
				break
			}
		}
		if !usable {
			continue
		}
		hasLocal := func(p *lb.Pool) bool {
			for _, be := range p.Backends() {
				if inFamily(be.Addr.Addr()) {
					return true
				}
			}
			return false
		}
		if svc.InternalTrafficPolicy == lb.PolicyLocal && !hasLocal(b.Internal) {
			internal++
		}
		externallyReachable := svc.NodePort != 0 || len(svc.ExternalIPs) > 0 || len(svc.LoadBalancerIPs) > 0
		if svc.ExternalTrafficPolicy == lb.PolicyLocal && externallyReachable && !hasLocal(b.External) {
			external++
		}
	}
	return internal, external
}
