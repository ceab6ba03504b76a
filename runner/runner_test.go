package runner

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

type recorder struct {
	mu    sync.Mutex
	calls []bool
	fail  int
}

func (r *recorder) sync(_ context.Context, full bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, full)
	if r.fail > 0 {
		r.fail--
		return errors.New("injected")
	}
	return nil
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRunner(t *testing.T) {
	t.Run("first sync is full, triggers coalesce", func(t *testing.T) {
		rec := &recorder{}
		r := New(rec.sync, 200*time.Millisecond, 0)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go r.Run(ctx)
		waitFor(t, "first sync", func() bool { return rec.count() == 1 })
		for i := 0; i < 50; i++ {
			r.Trigger()
		}
		waitFor(t, "second sync", func() bool { return rec.count() == 2 })
		time.Sleep(300 * time.Millisecond)
		if n := rec.count(); n != 2 {
			t.Fatalf("50 triggers in a burst gave %d syncs after the first, want 1", n-1)
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if !rec.calls[0] || rec.calls[1] {
			t.Fatalf("full flags = %v, want [true false]", rec.calls)
		}
	})
	t.Run("failure retries with a full sync", func(t *testing.T) {
		rec := &recorder{fail: 1}
		r := New(rec.sync, 0, 0)
		r.RetryInterval = 50 * time.Millisecond
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go r.Run(ctx)
		waitFor(t, "retry", func() bool { return rec.count() == 2 })
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if !rec.calls[1] {
			t.Fatal("retry was not a full sync")
		}
	})
	t.Run("max interval forces full syncs", func(t *testing.T) {
		rec := &recorder{}
		r := New(rec.sync, 0, 50*time.Millisecond)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go r.Run(ctx)
		waitFor(t, "periodic syncs", func() bool { return rec.count() >= 3 })
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for i, full := range rec.calls {
			if !full {
				t.Fatalf("sync %d not full", i)
			}
		}
	})
}
