package main

import (
	"context"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// memoryReturner hands memory back to the kernel once a load spike is over.
//
// The Go runtime returns freed memory lazily: the heap goal stays where the
// last GC under load put it, an idle process only collects when sysmon
// forces a GC every two minutes, and a pooled object survives one more
// collection in sync.Pool's victim cache. After 10,000 connections closed,
// svcproxy would hold the peak's memory for minutes. The load signal is
// the goroutine count plus two per open forwarded connection (the event
// loop gives a connection no goroutine; the portable engine gives it two,
// and the weight keeps the thresholds' meaning either way): when it has fallen to under half of the highest count
// seen since the last return, and that high was a real spike, two
// collections (the second empties the victim caches) and a scavenge give
// the memory back — what Envoy's overload manager calls shrink_heap. Under
// steady load the count does not halve, so nothing runs; a load falling in
// steps returns memory once per halving, down to rest (under a quarter of
// the spike threshold), so the last closes of a slow wind-down are returned
// too.
type memoryReturner struct {
	every   time.Duration
	spike   int // the least high-water mark that counts as a spike
	log     *zap.Logger
	returns prometheus.Counter
	count   func() int // the load signal; runtime.NumGoroutine
	free    func()     // runtime.GC then debug.FreeOSMemory
}

// newMemoryReturner watches load, the number of connections open (nil:
// none, goroutines only).
func newMemoryReturner(reg prometheus.Registerer, log *zap.Logger, conns func() int64) *memoryReturner {
	r := &memoryReturner{
		every: 10 * time.Second,
		spike: 2000,
		log:   log,
		returns: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "svcproxy", Subsystem: "memory", Name: "returns_total",
			Help: "Times memory was handed back to the kernel after a load spike ended.",
		}),
		count: func() int {
			n := runtime.NumGoroutine()
			if conns != nil {
				n += 2 * int(conns())
			}
			return n
		},
		free: func() {
			runtime.GC()
			debug.FreeOSMemory()
		},
	}
	reg.MustRegister(r.returns)
	return r
}

// Run samples the load signal every r.every until ctx ends.
func (r *memoryReturner) Run(ctx context.Context) {
	t := time.NewTicker(r.every)
	defer t.Stop()
	var st returnState
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.step(&st)
	}
}

// returnState is what step remembers between samples.
type returnState struct {
	high int // the highest count since memory was last returned
	peak int // the highest count since the load was last at rest
}

// step takes one sample.
func (r *memoryReturner) step(st *returnState) {
	n := r.count()
	st.high, st.peak = max(st.high, n), max(st.peak, n)
	if st.peak < r.spike || 2*n >= st.high {
		return
	}
	start := time.Now()
	r.free()
	r.returns.Inc()
	r.log.Debug("returned memory after a load spike", zap.Int("goroutines_high", st.high), zap.Int("goroutines", n),
		zap.Duration("took", time.Since(start)))
	st.high = n
	if 4*n < r.spike {
		st.peak = n // at rest: the next spike must be a spike again
	}
}
