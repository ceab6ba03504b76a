// Package health owns svcproxy's health endpoints: /livez (the process
// serves HTTP) and /healthz with kube-proxy's meaning: unhealthy when an
// update to the proxy rules has been waiting longer than the allowed lag,
// or when the node is being deleted.
package health

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"
)

// Tracker follows queued and applied updates. The zero value is not usable;
// use NewTracker.
type Tracker struct {
	maxLag time.Duration
	now    func() time.Time

	mu           sync.Mutex
	oldestQueued time.Time // zero: nothing pending
	lastApplied  time.Time
	nodeDeleting bool
}

// NewTracker returns a Tracker that reports unhealthy when an update has been
// queued for longer than maxLag without being applied (kube-proxy uses twice
// its sync period). now nil means time.Now.
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

// SetNodeDeleting marks the node as being deleted (or not).
func (t *Tracker) SetNodeDeleting(deleting bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.nodeDeleting = deleting
}

// Status is the /healthz body, in kube-proxy's field names.
type Status struct {
	LastUpdated time.Time `json:"lastUpdated"`
	CurrentTime time.Time `json:"currentTime"`
	NodeHealthy bool      `json:"nodeHealthy"`
	Healthy     bool      `json:"healthy"`
}

// Status reports the current health.
func (t *Tracker) Status() Status {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	lagging := !t.oldestQueued.IsZero() && now.Sub(t.oldestQueued) > t.maxLag
	return Status{
		LastUpdated: t.lastApplied,
		CurrentTime: now,
		NodeHealthy: !t.nodeDeleting,
		Healthy:     !lagging && !t.nodeDeleting,
	}
}

// Handler serves /healthz (200 or 503 with a Status body) and /livez.
func Handler(t *Tracker) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		st := t.Status()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if !st.Healthy {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(st)
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}
