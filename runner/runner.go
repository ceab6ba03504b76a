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
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// Runner runs Sync when triggered, no more often than MinInterval. It is
// the one place syncs are coalesced: sources write into the Store as
// changes come, and the Runner decides when a mode applies them.
type Runner struct {
	// Sync does the work; full asks it to rewrite and prune everything
	// rather than only what changed. An error schedules a retry.
	Sync func(ctx context.Context, full bool) error

	MinInterval   time.Duration // between syncs; zero: none
	MaxInterval   time.Duration // between full syncs; zero: never forced
	RetryInterval time.Duration // after a failed sync; zero: MinInterval, at least 1s

	// Hold, if set, holds full syncs back while it reports true: a sync
	// due in full (a retry, MaxInterval's, TriggerFull's) runs
	// incrementally and the full one is owed, made at the first check,
	// every HoldPoll, that finds Hold false (or at an earlier trigger),
	// or by the retry of a held sync that failed (a handover: the rules
	// are becoming a successor's).
	Hold     func() bool
	HoldPoll time.Duration // how often an owed full sync asks Hold again; not positive: 100ms

	// OnSync, if set, is told each sync's duration and result.
	OnSync func(full bool, took time.Duration, err error)
	// Metrics, if set, records every trigger and sync: durations always,
	// the last-success timestamp only when a sync succeeded, failures.
	Metrics *Metrics
	// Clock times the intervals and the metrics; nil means the real clock
	// (tests inject k8s.io/utils/clock/testing's FakeClock).
	Clock clock.WithTicker

	trigger  chan struct{}
	wantFull atomic.Bool // TriggerFull was called since the last sync started, or a held full sync is owed
}

// New returns a Runner for sync.
func New(sync func(ctx context.Context, full bool) error, minInterval, maxInterval time.Duration) *Runner {
	return &Runner{Sync: sync, MinInterval: minInterval, MaxInterval: maxInterval, trigger: make(chan struct{}, 1)}
}

// Trigger asks for a sync. It never blocks; triggers while one is pending
// coalesce into one sync.
func (r *Runner) Trigger() {
	if r.Metrics != nil {
		r.Metrics.queued(r.clock().Now())
	}
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// TriggerFull asks for a full sync, as soon as MinInterval allows: for
// when the rules may have been changed behind the mode's back (a tamper
// notification). It never blocks and coalesces like Trigger.
func (r *Runner) TriggerFull() {
	r.wantFull.Store(true)
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// Run syncs once at once (full), then on triggers and timers until ctx ends.
func (r *Runner) Run(ctx context.Context) {
	clk := r.clock()
	if r.Metrics != nil {
		r.Metrics.queued(clk.Now()) // the first sync is queued now, as kube-proxy's loop says at start
	}
	retryInterval := r.RetryInterval
	if retryInterval == 0 {
		retryInterval = max(r.MinInterval, time.Second)
	}
	var last time.Time
	full := true
	var fullC <-chan time.Time
	if r.MaxInterval > 0 {
		t := clk.NewTicker(r.MaxInterval)
		defer t.Stop()
		fullC = t.C()
	}
	for {
		if d := r.MinInterval - clk.Since(last); !last.IsZero() && d > 0 {
			t := clk.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C():
			}
		}
		select { // triggers that came while waiting are served by this sync
		case <-r.trigger:
		default:
		}
		if r.wantFull.Swap(false) {
			full = true
		}
		held := full && r.Hold != nil && r.Hold()
		if held {
			r.wantFull.Store(true) // owed
			full = false
		}
		start := clk.Now()
		err := r.Sync(ctx, full)
		if err != nil && ctx.Err() != nil {
			return // cut short by the end of Run: no failure to count or retry
		}
		last = clk.Now()
		if r.Metrics != nil {
			r.Metrics.synced(full, last.Sub(start), err, last)
		}
		if r.OnSync != nil {
			r.OnSync(full, last.Sub(start), err)
		}
		var retry, hold clock.Timer
		var retryC, holdC <-chan time.Time
		if err != nil {
			retry = clk.NewTimer(retryInterval)
			retryC = retry.C()
		}
		if held && err == nil { // a failed one is retried (in full) after RetryInterval
			hold = clk.NewTimer(r.holdPoll())
			holdC = hold.C()
		}
		full = false
		for waiting := true; waiting; {
			waiting = false
			select {
			case <-ctx.Done():
			case <-r.trigger:
			case <-retryC:
				full = true
			case <-fullC:
				full = true
			case <-holdC: // the owed full sync (wantFull), once Hold lets go
				if r.Hold() {
					hold.Reset(r.holdPoll())
					waiting = true
				}
			}
		}
		if retry != nil {
			retry.Stop()
		}
		if hold != nil {
			hold.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

func (r *Runner) holdPoll() time.Duration {
	if r.HoldPoll <= 0 {
		return 100 * time.Millisecond
	}
	return r.HoldPoll
}

func (r *Runner) clock() clock.WithTicker {
	if r.Clock != nil {
		return r.Clock
	}
	return clock.RealClock{}
}
