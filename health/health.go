// Package health owns svcproxy's health endpoints and their metrics: /livez
// (the process serves HTTP) and /healthz with kube-proxy's meaning and body:
// unhealthy when an update to the proxy rules has been waiting longer than
// the allowed lag, or when the node is not eligible (being deleted, or
// tainted for deletion by the cluster autoscaler); and
// kubeproxy_proxy_healthz_total / kubeproxy_proxy_livez_total by code.
package health

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Tracker follows queued and applied updates and the node's eligibility.
// The zero value is not usable; use NewTracker.
type Tracker struct {
	maxLag time.Duration
	now    func() time.Time

	mu           sync.Mutex
	oldestQueued time.Time // zero: nothing pending
	lastApplied  time.Time
	ineligible   bool
}

// NewTracker returns a Tracker that reports unhealthy when an update has been
// queued for longer than maxLag without being applied (kube-proxy uses twice
// its sync period). now nil means time.Now. The node is eligible until told
// otherwise (without a Node object, as with a services file, it stays so).
func NewTracker(maxLag time.Duration, now func() time.Time) *Tracker {
	if now == nil {
		now = time.Now
	}
	return &Tracker{maxLag: maxLag, now: now}
}

// Queued records that an update is waiting to be applied.
func (t *Tracker) Queued() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.oldestQueued.IsZero() {
		t.oldestQueued = t.now()
	}
}

// Applied records that every queued update has been applied.
func (t *Tracker) Applied() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.oldestQueued = time.Time{}
	t.lastApplied = t.now()
}

// SetNodeEligible records whether the node may receive load-balanced
// traffic: kube-proxy's "eligible" is not being deleted and not tainted
// ToBeDeletedByClusterAutoscaler.
func (t *Tracker) SetNodeEligible(eligible bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ineligible = !eligible
}

// NodeEligible reports what SetNodeEligible last said (true before).
func (t *Tracker) NodeEligible() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return !t.ineligible
}

// Status is the /healthz and /livez body, kube-proxy's ProxyHealth: Healthy
// is the proxy rules' health only; /healthz adds NodeEligible and fails
// when either is false.
type Status struct {
	LastUpdated  time.Time `json:"lastUpdated"`
	CurrentTime  time.Time `json:"currentTime"`
	NodeEligible *bool     `json:"nodeEligible,omitempty"`
	Healthy      bool      `json:"healthy"`
}

// Status reports the proxy rules' health: false when an update has waited
// longer than the allowed lag. NodeEligible is left unset.
func (t *Tracker) Status() Status {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	lagging := !t.oldestQueued.IsZero() && now.Sub(t.oldestQueued) > t.maxLag
	return Status{LastUpdated: t.lastApplied, CurrentTime: now, Healthy: !lagging}
}

// Metrics count the health endpoints' answers, in kube-proxy's names.
type Metrics struct {
	healthz *prometheus.CounterVec // code
	livez   *prometheus.CounterVec // code
}

// NewMetrics registers kubeproxy_proxy_healthz_total and
// kubeproxy_proxy_livez_total with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		healthz: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "kubeproxy", Name: "proxy_healthz_total",
			Help: "Cumulative proxy healthz HTTP status",
		}, []string{"code"}),
		livez: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "kubeproxy", Name: "proxy_livez_total",
			Help: "Cumulative proxy livez HTTP status",
		}, []string{"code"}),
	}
	for _, code := range []string{"200", "503"} {
		m.healthz.WithLabelValues(code)
	}
	m.livez.WithLabelValues("200")
	reg.MustRegister(m.healthz, m.livez)
	return m
}

// answered counts one answer of /healthz (else /livez); m may be nil.
func (m *Metrics) answered(healthz bool, code int) {
	if m == nil {
		return
	}
	v := m.livez
	if healthz {
		v = m.healthz
	}
	v.WithLabelValues(strconv.Itoa(code)).Inc()
}

// Handler serves /healthz (200 or 503 with a Status body, as kube-proxy)
// and /livez (200 while the process serves), counting each answer in m
// (nil: not counted).
func Handler(t *Tracker, m *Metrics) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		st := t.Status()
		eligible := t.NodeEligible()
		st.NodeEligible = &eligible
		code := http.StatusOK
		if !st.Healthy || !eligible {
			code = http.StatusServiceUnavailable
		} else {
			// As kube-proxy: a healthy answer says it is current (older
			// releases updated lastUpdated on every sync loop run).
			st.LastUpdated = st.CurrentTime
		}
		m.answered(true, code)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(st)
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, r *http.Request) {
		m.answered(false, http.StatusOK)
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}
