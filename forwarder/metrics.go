package forwarder

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the forwarder's Prometheus metrics. Labels are low-cardinality
// on purpose: no addresses, no Service names.
type Metrics struct {
	Connections     *prometheus.CounterVec // by protocol, result
	Active          *prometheus.GaugeVec   // by protocol
	DialAttempts    *prometheus.CounterVec // by result
	DialRetries     prometheus.Counter
	ConnectLatency  prometheus.Histogram
	Bytes           *prometheus.CounterVec // by direction: in (client→backend), out
	Closes          *prometheus.CounterVec // by reason
	AcceptErrors    *prometheus.CounterVec // by reason
	Datagrams       *prometheus.CounterVec // UDP, by direction
	UDPDrops        *prometheus.CounterVec // UDP datagrams the kernel dropped at svcproxy's sockets, by socket
	Offloaded       *prometheus.CounterVec // TCP connections handed to the kernel offload, by result
	IOUringMessages prometheus.Counter     // TCP messages read and written in io_uring batches
	IOUringWorkers  prometheus.Gauge       // event-loop workers batching through io_uring
	Rebalanced      prometheus.Counter     // TCP connections a worker accepted and handed to a less loaded one
	Listeners       prometheus.Gauge
	ListenErrors    prometheus.Counter
	Draining        prometheus.Gauge
	SnapshotVersion prometheus.Gauge
	LastApply       prometheus.Gauge

	// Children resolved once, so the hot path does no label lookups.
	connOK, connNoService, connNoEndpoints, connDialFailed, connLimit, connClientGone prometheus.Counter
	connFDLimit                                                                       prometheus.Counter
	activeTCP                                                                         prometheus.Gauge
	offloadOK, offloadFailed                                                          prometheus.Counter
	dialOK, dialRefused, dialTimeout, dialError                                       prometheus.Counter
	bytesIn, bytesOut                                                                 prometheus.Counter
	acceptFDLimit, acceptOther                                                        prometheus.Counter
	closes                                                                            [len(closeReasons)]prometheus.Counter
	udpFlowsOK, udpNoService, udpNoEndpoints, udpDialFailed, udpLimit                 prometheus.Counter
	activeUDP                                                                         prometheus.Gauge
	udpIn, udpOut                                                                     prometheus.Counter
	udpDropsFrontend, udpDropsReply                                                   prometheus.Counter

	// refreshDrops, set by the forwarder, reads its sockets' drop counts
	// into UDPDrops; run when the metrics are scraped.
	refreshDrops atomic.Pointer[func()]
}

// dropsCollector collects UDPDrops after bringing it up to date: the kernel
// keeps the counts per socket, and they are read when asked for rather
// than on the datagram path.
type dropsCollector struct{ m *Metrics }

func (c dropsCollector) Describe(ch chan<- *prometheus.Desc) { c.m.UDPDrops.Describe(ch) }

func (c dropsCollector) Collect(ch chan<- prometheus.Metric) {
	if fn := c.m.refreshDrops.Load(); fn != nil {
		(*fn)()
	}
	c.m.UDPDrops.Collect(ch)
}

// Results of a connection, for the connections_total metric.
const (
	resultOK          = "ok"
	resultNoService   = "no_service"
	resultNoEndpoints = "no_endpoints"
	resultDialFailed  = "dial_failed"
	resultLimit       = "limit"
	resultClientGone  = "client_gone"
	resultFDLimit     = "fd_limit"
)

// NewMetrics creates the forwarder's metrics and registers them with reg
// (nil: not registered, for tests and embedding).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns, sub = "svcproxy", "forwarder"
	m := &Metrics{
		Connections: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "connections_total",
			Help: "Accepted connections (UDP: flows) by protocol and result (ok, no_service, no_endpoints, dial_failed, limit, client_gone; fd_limit: refused at once because the process was out of descriptors)."}, []string{"protocol", "result"}),
		Active: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "active_connections",
			Help: "Connections currently forwarded."}, []string{"protocol"}),
		DialAttempts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "dial_attempts_total",
			Help: "Backend connect attempts by result (ok, refused, timeout, error)."}, []string{"result"}),
		DialRetries: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "dial_retries_total",
			Help: "Connect attempts made after an earlier attempt of the same connection failed."}),
		ConnectLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "connect_duration_seconds",
			Help:    "Time to connect to a backend, successful attempts only.",
			Buckets: []float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2}}),
		Bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "bytes_total",
			Help: "Bytes forwarded, direction in (client to backend) or out (backend to client); counted when a direction ends."}, []string{"direction"}),
		Closes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "closes_total",
			Help: "Forwarded connections ended, by reason."}, []string{"reason"}),
		AcceptErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "accept_errors_total",
			Help: "accept(2) failures by reason (fd_limit: out of descriptors or memory for the connection; the queued client is reset with a descriptor held in reserve, or accepting backs off when even that fails)."}, []string{"reason"}),
		Datagrams: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "datagrams_total",
			Help: "UDP datagrams forwarded, direction in (client to backend) or out (backend to client)."}, []string{"direction"}),
		UDPDrops: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "udp_receive_drops_total",
			Help: "UDP datagrams the kernel dropped because a socket's receive buffer was full, by socket: frontend (from clients) or reply (from backends). See --udp-receive-buffer."}, []string{"socket"}),
		Offloaded: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "offloaded_connections_total",
			Help: "TCP connections whose sockets were put into the kernel offload (--offload=sockmap), by result (ok; failed: left on the user-space path)."}, []string{"result"}),
		IOUringMessages: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "io_uring_messages_total",
			Help: "TCP messages read and written in io_uring batches (--io-uring); the rest took a read and a write each, or a splice."}),
		IOUringWorkers: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "io_uring_workers",
			Help: "Event-loop workers moving small messages in io_uring batches; 0 with --io-uring=auto: the kernel or a sandbox refused io_uring (the log says why)."}),
		Rebalanced: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "rebalanced_connections_total",
			Help: "TCP connections an event-loop worker accepted and handed to a worker with clearly fewer connections (SO_REUSEPORT spreads them by address, not load)."}),
		Listeners: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "listeners",
			Help: "Listening sockets open."}),
		ListenErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "listen_errors_total",
			Help: "Frontends or redirect addresses that could not be bound."}),
		Draining: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "draining_connections",
			Help: "Open connections to backends no longer listed, waiting to end or for the drain timeout."}),
		SnapshotVersion: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "snapshot_version",
			Help: "Version of the load-balancer snapshot the forwarder routes with."}),
		LastApply: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "last_apply_timestamp_seconds",
			Help: "When the forwarder last applied a snapshot, in seconds since the epoch."}),
	}
	m.connOK = m.Connections.WithLabelValues("TCP", resultOK)
	m.connNoService = m.Connections.WithLabelValues("TCP", resultNoService)
	m.connNoEndpoints = m.Connections.WithLabelValues("TCP", resultNoEndpoints)
	m.connDialFailed = m.Connections.WithLabelValues("TCP", resultDialFailed)
	m.connLimit = m.Connections.WithLabelValues("TCP", resultLimit)
	m.connClientGone = m.Connections.WithLabelValues("TCP", resultClientGone)
	m.connFDLimit = m.Connections.WithLabelValues("TCP", resultFDLimit)
	m.activeTCP = m.Active.WithLabelValues("TCP")
	m.offloadOK = m.Offloaded.WithLabelValues("ok")
	m.offloadFailed = m.Offloaded.WithLabelValues("failed")
	m.udpFlowsOK = m.Connections.WithLabelValues("UDP", resultOK)
	m.udpNoService = m.Connections.WithLabelValues("UDP", resultNoService)
	m.udpNoEndpoints = m.Connections.WithLabelValues("UDP", resultNoEndpoints)
	m.udpDialFailed = m.Connections.WithLabelValues("UDP", resultDialFailed)
	m.udpLimit = m.Connections.WithLabelValues("UDP", resultLimit)
	m.activeUDP = m.Active.WithLabelValues("UDP")
	m.udpIn = m.Datagrams.WithLabelValues("in")
	m.udpOut = m.Datagrams.WithLabelValues("out")
	m.udpDropsFrontend = m.UDPDrops.WithLabelValues("frontend")
	m.udpDropsReply = m.UDPDrops.WithLabelValues("reply")
	m.dialOK = m.DialAttempts.WithLabelValues("ok")
	m.dialRefused = m.DialAttempts.WithLabelValues("refused")
	m.dialTimeout = m.DialAttempts.WithLabelValues("timeout")
	m.dialError = m.DialAttempts.WithLabelValues("error")
	m.bytesIn = m.Bytes.WithLabelValues("in")
	m.bytesOut = m.Bytes.WithLabelValues("out")
	m.acceptFDLimit = m.AcceptErrors.WithLabelValues("fd_limit")
	m.acceptOther = m.AcceptErrors.WithLabelValues("other")
	for i, r := range closeReasons {
		if r == "" {
			r = "unknown"
		}
		m.closes[i] = m.Closes.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.Connections, m.Active, m.DialAttempts, m.DialRetries, m.ConnectLatency, m.Bytes, m.Datagrams,
			m.Closes, m.AcceptErrors, m.Offloaded, m.IOUringMessages, m.IOUringWorkers, m.Rebalanced, m.Listeners, m.ListenErrors, m.Draining, m.SnapshotVersion, m.LastApply, dropsCollector{m})
	}
	return m
}
