package kube

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the Kubernetes source's metrics, in the svcproxy_kube_
// namespace, with low-cardinality labels only (no object names).
type Metrics struct {
	events        *prometheus.CounterVec   // kind, event
	invalid       *prometheus.CounterVec   // kind
	pending       prometheus.Gauge         // Services waiting for the next flush
	flushes       *prometheus.CounterVec   // type: full | partial
	flushDuration *prometheus.HistogramVec // type
	servicePorts  prometheus.Gauge
	watchErrors   *prometheus.CounterVec // kind
	lastFlush     prometheus.Gauge
}

// NewMetrics registers the source's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns, sub = "svcproxy", "kube"
	m := &Metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "events_total",
			Help: "Informer events received, by object kind (Service, EndpointSlice, Node) and event (add, update, delete).",
		}, []string{"kind", "event"}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "invalid_objects_total",
			Help: "Conversions of an object that found it invalid in part or whole (each logged), by kind.",
		}, []string{"kind"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "sync_pending",
			Help: "Services changed in the API server and not yet written to the load-balancer store.",
		}),
		flushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "flushes_total",
			Help: "Writes of changed Services into the load-balancer store, by type (full: every Service; partial: the changed ones).",
		}, []string{"type"}),
		flushDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "flush_duration_seconds",
			Help:    "How long converting and writing Services into the load-balancer store took, by type.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
		}, []string{"type"}),
		servicePorts: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "service_ports",
			Help: "Service ports written to the load-balancer store.",
		}),
		watchErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "watch_errors_total",
			Help: "Lists or watches of the API server that failed (the last state is kept meanwhile), by kind.",
		}, []string{"kind"}),
		lastFlush: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "last_flush_timestamp_seconds",
			Help: "When Services were last written to the load-balancer store, in seconds since the epoch.",
		}),
	}
	for _, kind := range []string{kindService, kindSlice, kindNode} {
		for _, ev := range []string{"add", "update", "delete"} {
			m.events.WithLabelValues(kind, ev)
		}
		m.invalid.WithLabelValues(kind)
		m.watchErrors.WithLabelValues(kind)
	}
	for _, t := range []string{"full", "partial"} {
		m.flushes.WithLabelValues(t)
		m.flushDuration.WithLabelValues(t)
	}
	reg.MustRegister(m.events, m.invalid, m.pending, m.flushes, m.flushDuration, m.servicePorts, m.watchErrors, m.lastFlush)
	return m
}
