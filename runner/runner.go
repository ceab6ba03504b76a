// Package runner owns the sync loop that carries load-balancer snapshots to
// the proxy modes: it coalesces bursts of changes (at most one sync per
// MinInterval), retries a failed sync after RetryInterval, and forces a full
// sync at least every MaxInterval so rules that were tampered with are
// repaired — the shape of kube-proxy's BoundedFrequencyRunner. It also owns
// the sync loop's metrics, in kube-proxy's names beside svcproxy's own, and
// Changes, which follows each Service and endpoint change to the sync that
// programs it (pending changes, network programming latency).
package runner

import (
	"context"
	"time"
)

// Runner runs Sync when triggered, no more often than MinInterval.
type Runner struct {
	// Sync does the work; full asks it to rewrite and prune everything
	// rather than only what changed. An error schedules a retry.
	Sync func(ctx context.Context, full bool) error

	MinInterval   time.Duration // between syncs; zero: none
	MaxInterval   time.Duration // between full syncs; zero: never forced
	RetryInterval time.Duration // after a failed sync; zero: MinInterval, at least 1s

	// OnSync, if set, is told each sync's duration and result.
	OnSync func(full bool, took time.Duration, err error)
	// Metrics, if set, records every trigger and sync: durations always,
	// the last-success timestamp only when a sync succeeded, failures.
	Metrics *Metrics
	// Now is the clock for metric timestamps; nil means time.Now.
	Now func() time.Time

	trigger chan struct{}
}

// New returns a Runner for sync.
func New(sync func(ctx context.Context, full bool) error, minInterval, maxInterval time.Duration) *Runner {
	return &Runner{Sync: sync, MinInterval: minInterval, MaxInterval: maxInterval, trigger: make(chan struct{}, 1)}
}

// Trigger asks for a sync. It never blocks; triggers while one is pending
// coalesce into one sync.
func (r *Runner) Trigger() {
	if r.Metrics != nil {
		r.Metrics.queued(r.now())
	}
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// Run syncs once at once (full), then on triggers and timers until ctx ends.
func (r *Runner) Run(ctx context.Context) {
	if r.Metrics != nil {
		r.Metrics.queued(r.now()) // the first sync is queued now, as kube-proxy's loop says at start
	}
	retry := r.RetryInterval
	if retry == 0 {
		retry = max(r.MinInterval, time.Second)
	}
	var last time.Time
	full := true
	var retryC <-chan time.Time
	var fullC <-chan time.Time
	if r.MaxInterval > 0 {
		t := time.NewTicker(r.MaxInterval)
		defer t.Stop()
		fullC = t.C
	}
	for {
		if wait := r.MinInterval - time.Since(last); !last.IsZero() && wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		select { // triggers that came while waiting are served by this sync
		case <-r.trigger:
		default:
		}
		start := time.Now()
		err := r.Sync(ctx, full)
		last = time.Now()
		if r.Metrics != nil {
			r.Metrics.synced(full, last.Sub(start), err, r.now())
		}
		if r.OnSync != nil {
			r.OnSync(full, last.Sub(start), err)
		}
		retryC = nil
		if err != nil {
			retryC = time.After(retry)
		}
		full = false
		select {
		case <-ctx.Done():
			return
		case <-r.trigger:
		case <-retryC:
			full = true
		case <-fullC:
			full = true
		}
	}
}

func (r *Runner) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}
