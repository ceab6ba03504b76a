package main

import "github.com/prometheus/client_golang/prometheus"

// daemonMetrics are the sync loop's metrics, named after kube-proxy's where
// the meaning is the same (kubeproxy_sync_proxy_rules_duration_seconds and
// friends), in svcproxy's namespace.
type daemonMetrics struct {
	syncDuration       prometheus.Histogram
	networkProgramming prometheus.Histogram
	lastSync           prometheus.Gauge
	services           prometheus.Gauge
	sourceErrors       prometheus.Counter
	mode               *prometheus.GaugeVec
}

func newDaemonMetrics(reg prometheus.Registerer) *daemonMetrics {
	m := &daemonMetrics{
		syncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "svcproxy", Subsystem: "sync", Name: "proxy_rules_duration_seconds",
			Help:    "How long one sync of the proxy mode took.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		networkProgramming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "svcproxy", Name: "network_programming_duration_seconds",
			Help:    "From a change reaching the load-balancer store to the proxy mode serving it.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 20),
		}),
		lastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "svcproxy", Subsystem: "sync", Name: "proxy_rules_last_timestamp_seconds",
			Help: "When the proxy mode was last synced, in seconds since the epoch.",
		}),
		services: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "svcproxy", Subsystem: "source", Name: "service_ports",
			Help: "Service ports the load-balancer store holds.",
		}),
		sourceErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "svcproxy", Subsystem: "source", Name: "load_errors_total",
			Help: "Loads of the services source that rejected some or all of it.",
		}),
		mode: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "svcproxy", Name: "proxy_mode",
			Help: "1 for the proxy mode running, with the mode asked for (they differ after a fallback).",
		}, []string{"mode", "requested"}),
	}
	reg.MustRegister(m.mode, m.syncDuration, m.networkProgramming, m.lastSync, m.services, m.sourceErrors)
	return m
}
