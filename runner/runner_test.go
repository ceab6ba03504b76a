package runner

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// loop runs a Runner on a fake clock. Each sync, once done (OnSync), is
// handed to the test (expect), so the test knows where the loop is:
// nothing here sleeps to let time pass.
type loop struct {
	t     *testing.T
	r     *Runner
	clk   *clocktesting.FakeClock
	calls chan bool // each sync's full flag, unbuffered: the loop waits for the test
	fail  atomic.Int32
	n     int // syncs seen
}

// startLoop runs a Runner with the intervals given on a fake clock; its
// first fail syncs fail. edit, if set, changes the Runner before it runs.
func startLoop(t *testing.T, minInterval, maxInterval time.Duration, fail int, edit func(*Runner)) *loop {
	t.Helper()
	l := &loop{t: t, clk: clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0)), calls: make(chan bool)}
	l.fail.Store(int32(fail))
	ctx, cancel := context.WithCancel(context.Background())
	l.r = New(func(ctx context.Context, full bool) error {
		if l.fail.Add(-1) >= 0 {
			return errors.New("injected")
		}
		return nil
	}, minInterval, maxInterval)
	l.r.Clock = l.clk
	if edit != nil {
		edit(l.r)
	}
	onSync := l.r.OnSync
	l.r.OnSync = func(full bool, took time.Duration, err error) {
		if onSync != nil {
			onSync(full, took, err)
		}
		select {
		case l.calls <- full:
		case <-ctx.Done():
		}
	}
	done := make(chan struct{})
	go func() { l.r.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
	return l
}

// expect waits for the next sync and checks it is full or not.
func (l *loop) expect(what string, full bool) {
	l.t.Helper()
	select {
	case got := <-l.calls:
		l.n++
		if got != full {
			l.t.Fatalf("%s: sync %d full = %v, want %v", what, l.n, got, full)
		}
	case <-time.After(5 * time.Second):
		l.t.Fatalf("%s: no sync (the fake clock at %v, %d waiters)", what, l.clk.Now(), l.clk.Waiters())
	}
}

// none checks no sync is under way. Where the loop is waiting for a timer
// that is not due, it cannot be: the fake clock has not fired it.
func (l *loop) none(what string) {
	l.t.Helper()
	select {
	case full := <-l.calls:
		l.t.Fatalf("%s: unexpected sync (full %v) after %d", what, full, l.n)
	default:
	}
}

// waiters waits until the loop waits on n timers and tickers: it has
// settled, and stepping the clock now reaches it.
func (l *loop) waiters(what string, n int) {
	l.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for l.clk.Waiters() != n {
		if time.Now().After(deadline) {
			l.t.Fatalf("%s: the loop waits on %d timers, want %d", what, l.clk.Waiters(), n)
		}
		time.Sleep(time.Millisecond) // polling the loop's state, not letting time pass
	}
}

func (l *loop) triggers(n int) {
	for range n {
		l.r.Trigger()
	}
}

// TestRunCoalesces: the first sync is full and at once; a burst of
// triggers, however long, gives one sync per MinInterval.
func TestRunCoalesces(t *testing.T) {
	l := startLoop(t, time.Second, 0, 0, nil)
	l.expect("the first sync", true)

	l.triggers(50)
	l.waiters("a burst right after a sync", 1) // waiting out MinInterval
	l.clk.Step(500 * time.Millisecond)
	l.triggers(50) // the burst goes on
	l.clk.Step(499 * time.Millisecond)
	l.none("before MinInterval")
	l.clk.Step(time.Millisecond)
	l.expect("MinInterval after the last sync", false)

	// Triggers during the sync's MinInterval are served by the next one.
	l.triggers(10)
	l.waiters("the next burst", 1)
	l.clk.Step(999 * time.Millisecond)
	l.none("before MinInterval again")
	l.clk.Step(time.Millisecond)
	l.expect("the next burst", false)

	// A trigger long after the last sync is served at once.
	l.waiters("idle", 0)
	l.clk.Step(time.Hour)
	l.none("idle, no trigger")
	l.triggers(1)
	l.expect("a lone trigger", false)
}

// TestRunFullEveryMaxInterval: a full sync every MaxInterval, whatever
// partial syncs came between.
func TestRunFullEveryMaxInterval(t *testing.T) {
	l := startLoop(t, 0, 30*time.Second, 0, nil)
	l.expect("the first sync", true)
	l.waiters("the full-sync ticker", 1)
	l.clk.Step(29 * time.Second)
	l.none("before MaxInterval")
	l.clk.Step(time.Second)
	l.expect("MaxInterval", true)
	l.triggers(1)
	l.expect("a trigger between", false)
	l.clk.Step(30 * time.Second)
	l.expect("MaxInterval again", true)
}

// TestRunTriggerFull: TriggerFull asks for a full sync, within
// MinInterval like any trigger, and coalesces with partial triggers into
// that one full sync.
func TestRunTriggerFull(t *testing.T) {
	l := startLoop(t, time.Second, time.Hour, 0, nil)
	l.expect("the first sync", true)
	l.triggers(3)
	l.r.TriggerFull()
	l.triggers(3)
	l.waiters("MinInterval after the first sync", 2) // and the full-sync ticker
	l.clk.Step(time.Second)
	l.expect("a tamper notification among changes", true)
	l.triggers(1)
	l.clk.Step(time.Second)
	l.expect("a change after it", false)
	l.clk.Step(time.Second)
	l.r.TriggerFull()
	l.expect("a lone tamper notification", true)
	l.none("nothing after it")
}

// TestRunRetries: a failed sync is retried, full, after RetryInterval
// (default MinInterval, at least 1s), until one succeeds; then triggers
// give partial syncs again.
func TestRunRetries(t *testing.T) {
	for _, tc := range []struct {
		name             string
		min, retry, want time.Duration
	}{
		{"RetryInterval", time.Second, 5 * time.Second, 5 * time.Second},
		{"default: MinInterval", 3 * time.Second, 0, 3 * time.Second},
		{"default: at least 1s", 0, 0, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := startLoop(t, tc.min, 0, 2, func(r *Runner) { r.RetryInterval = tc.retry })
			l.expect("the first sync, failing", true)
			l.waiters("the retry timer", 1)
			l.clk.Step(tc.want - time.Millisecond)
			l.none("before the retry interval")
			l.clk.Step(time.Millisecond)
			l.expect("the retry, failing", true)
			l.waiters("the next retry timer", 1)
			l.clk.Step(tc.want)
			l.expect("the second retry, succeeding", true)

			l.triggers(1)
			if tc.min > 0 {
				l.waiters("MinInterval after the retry", 1)
				l.clk.Step(tc.min)
			}
			l.expect("a trigger after success", false)
		})
	}
}

// TestRunHold: while Hold reports true, a sync due in full runs
// incrementally and the full one is owed; it is made once Hold lets go,
// without another trigger.
func TestRunHold(t *testing.T) {
	var holding atomic.Bool
	l := startLoop(t, 0, time.Hour, 0, func(r *Runner) {
		r.Hold = holding.Load
		r.HoldPoll = time.Second
	})
	l.expect("the first sync", true)
	holding.Store(true)
	l.r.TriggerFull()
	l.expect("a full sync asked for while held", false)
	l.waiters("polling Hold", 2) // and the full-sync ticker
	l.clk.Step(time.Second)
	l.waiters("still held: polling again", 2)
	l.none("still held")
	l.r.Trigger()
	l.expect("a change while held", false) // the full one still owed
	holding.Store(false)
	l.waiters("polling Hold after the change", 2)
	l.clk.Step(time.Second)
	l.expect("the owed full sync once released", true)
	l.triggers(1)
	l.expect("then changes as usual", false)
}

// TestRunHoldFailed: a held sync that fails is retried after
// RetryInterval, as any failed sync, not at the next check of Hold.
func TestRunHoldFailed(t *testing.T) {
	var holding atomic.Bool
	l := startLoop(t, 0, time.Hour, 0, func(r *Runner) { r.Hold = holding.Load })
	l.expect("the first sync", true)
	holding.Store(true)
	l.fail.Store(1)
	l.r.TriggerFull()
	l.expect("a held sync that fails", false)
	holding.Store(false)
	l.waiters("the retry timer and the full-sync ticker", 2)
	l.clk.Step(500 * time.Millisecond) // past HoldPoll, short of RetryInterval
	l.none("before RetryInterval")
	l.clk.Step(500 * time.Millisecond)
	l.expect("the retry, in full", true)
}
