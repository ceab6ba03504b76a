package runner

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The ip_family label values, as kube-proxy spells them.
const (
	IPv4 = "IPv4"
	IPv6 = "IPv6"
)

// Metrics are the sync loop's metrics: kube-proxy's (kubeproxy_*, with its
// names, labels, buckets and meanings, so its dashboards and alerts read
// svcproxy) beside svcproxy's own (svcproxy_sync_*). One svcproxy sync
// programs every IP family at once, so each ip_family series of a sync
// metric moves together.
type Metrics struct {
	families []string

	duration    *prometheus.HistogramVec // ip_family
	fullDur     *prometheus.HistogramVec // ip_family
	partialDur  *prometheus.HistogramVec // ip_family
	lastSuccess *prometheus.GaugeVec     // ip_family
	lastQueued  *prometheus.GaugeVec     // ip_family
	programming *prometheus.HistogramVec // ip_family
	noLocal     *prometheus.GaugeVec     // traffic_policy, ip_family

	endpointsPending prometheus.Gauge
	endpointsTotal   prometheus.Counter
	servicesPending  prometheus.Gauge
	servicesTotal    prometheus.Counter

	ownDuration    prometheus.Histogram
	ownLastSuccess prometheus.Gauge
	ownFailures    *prometheus.CounterVec // type: full | partial
}

// NewMetrics registers the sync loop's metrics with reg. families are the
// ip_family label values the proxy mode programs (IPv4, IPv6); empty means
// IPv4 only.
func NewMetrics(reg prometheus.Registerer, families ...string) *Metrics {
	if len(families) == 0 {
		families = []string{IPv4}
	}
	const kp = "kubeproxy"
	// kube-proxy's buckets: ExponentialBuckets(0.001, 2, 15) for syncs.
	syncBuckets := prometheus.ExponentialBuckets(0.001, 2, 15)
	hist := func(name, help string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: kp, Name: name, Help: help, Buckets: syncBuckets,
		}, []string{"ip_family"})
	}
	m := &Metrics{
		families:   families,
		duration:   hist("sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds"),
		fullDur:    hist("sync_full_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for full resyncs"),
		partialDur: hist("sync_partial_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for partial resyncs"),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: kp, Name: "sync_proxy_rules_last_timestamp_seconds",
			Help: "The last time proxy rules were successfully synced",
		}, []string{"ip_family"}),
		lastQueued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: kp, Name: "sync_proxy_rules_last_queued_timestamp_seconds",
			Help: "The last time a sync of proxy rules was queued",
		}, []string{"ip_family"}),
		programming: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: kp, Name: "network_programming_duration_seconds",
			Help:    "In Cluster Network Programming Latency in seconds",
			Buckets: programmingBuckets(),
		}, []string{"ip_family"}),
		noLocal: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: kp, Name: "sync_proxy_rules_no_local_endpoints_total",
			Help: "Number of services with a Local traffic policy and no endpoints",
		}, []string{"traffic_policy", "ip_family"}),
		endpointsPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Subsystem: kp, Name: "sync_proxy_rules_endpoint_changes_pending",
			Help: "Pending proxy rules Endpoint changes",
		}),
		endpointsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: kp, Name: "sync_proxy_rules_endpoint_changes_total",
			Help: "Cumulative proxy rules Endpoint changes",
		}),
		servicesPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Subsystem: kp, Name: "sync_proxy_rules_service_changes_pending",
			Help: "Pending proxy rules Service changes",
		}),
		servicesTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: kp, Name: "sync_proxy_rules_service_changes_total",
			Help: "Cumulative proxy rules Service changes",
		}),
		ownDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "svcproxy", Subsystem: "sync", Name: "proxy_rules_duration_seconds",
			Help:    "How long one sync of the proxy mode took, failed or not.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		ownLastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "svcproxy", Subsystem: "sync", Name: "proxy_rules_last_timestamp_seconds",
			Help: "When the proxy mode was last synced successfully, in seconds since the epoch.",
		}),
		ownFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "svcproxy", Subsystem: "sync", Name: "proxy_rules_failures_total",
			Help: "Syncs of the proxy mode that failed (each is retried as a full sync), by type (full, partial).",
		}, []string{"type"}),
	}
	for _, fam := range families {
		m.duration.WithLabelValues(fam)
		m.fullDur.WithLabelValues(fam)
		m.partialDur.WithLabelValues(fam)
		m.lastSuccess.WithLabelValues(fam)
		m.lastQueued.WithLabelValues(fam)
		m.programming.WithLabelValues(fam)
		m.noLocal.WithLabelValues("internal", fam)
		m.noLocal.WithLabelValues("external", fam)
	}
	m.ownFailures.WithLabelValues("full")
	m.ownFailures.WithLabelValues("partial")
	reg.MustRegister(m.duration, m.fullDur, m.partialDur, m.lastSuccess, m.lastQueued, m.programming, m.noLocal,
		m.endpointsPending, m.endpointsTotal, m.servicesPending, m.servicesTotal,
		m.ownDuration, m.ownLastSuccess, m.ownFailures)
	return m
}

// programmingBuckets are kube-proxy's for network programming latency:
// 0.25s, 0.5s, 1s..59s by 1s, 60s..115s by 5s, 120s..300s by 30s.
func programmingBuckets() []float64 {
	b := prometheus.LinearBuckets(0.25, 0.25, 2)
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	return append(b, prometheus.LinearBuckets(120, 30, 7)...)
}

// queued records that a sync was asked for at now.
func (m *Metrics) queued(now time.Time) {
	for _, fam := range m.families {
		m.lastQueued.WithLabelValues(fam).Set(seconds(now))
	}
}

// synced records one sync: its duration always (as kube-proxy does), the
// success timestamp only when it succeeded, the failure otherwise.
func (m *Metrics) synced(full bool, took time.Duration, err error, now time.Time) {
	byType := m.partialDur
	kind := "partial"
	if full {
		byType, kind = m.fullDur, "full"
	}
	for _, fam := range m.families {
		m.duration.WithLabelValues(fam).Observe(took.Seconds())
		byType.WithLabelValues(fam).Observe(took.Seconds())
		if err == nil {
			m.lastSuccess.WithLabelValues(fam).Set(seconds(now))
		}
	}
	m.ownDuration.Observe(took.Seconds())
	if err != nil {
		m.ownFailures.WithLabelValues(kind).Inc()
		return
	}
	m.ownLastSuccess.Set(seconds(now))
}

// SetNoLocalEndpoints records, after a successful sync, how many Service
// ports of family have a Local traffic policy, usable endpoints elsewhere
// and none on this node, for internal (ClusterIP) and external traffic.
func (m *Metrics) SetNoLocalEndpoints(family string, internal, external int) {
	m.noLocal.WithLabelValues("internal", family).Set(float64(internal))
	m.noLocal.WithLabelValues("external", family).Set(float64(external))
}

func seconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
