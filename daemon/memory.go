package daemon

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/lb"
)

// memoryReturner hands memory back to the kernel once a load spike is over,
// and once a large configuration has shrunk.
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
//
// A configuration that shrinks moves no load signal, and its memory is
// the bulk of svcproxy's heap (about 3 KiB per Service port and endpoint:
// 58,288 Services held 570 MiB, returned only by sysmon's GC minutes later,
// and then only in part). So the size of the last applied snapshot
// (Service ports plus endpoints) is a second signal with the same rule:
// once it has fallen to under half of the largest applied since the last
// such return, and that was a large configuration, memory is returned, at
// most once per configGap. Small configurations, steady ones and ones that
// change without halving never trigger it.
type memoryReturner struct {
	every   time.Duration
	spike   int // the least high-water mark that counts as a spike
	log     *zap.Logger
	returns prometheus.Counter
	count   func() int // the load signal; runtime.NumGoroutine
	free    func()     // runtime.GC then debug.FreeOSMemory

	configSpike int           // the least applied configuration size that counts as large
	configGap   time.Duration // the least time between two returns for shrinking configurations
	now         func() time.Time

	mu         sync.Mutex
	config     int // the size of the last snapshot applied
	configHigh int // the largest applied since the last return for a shrink
}

// newMemoryReturner watches load, the number of connections open (nil:
// none, goroutines only), and the applied configuration (Applied).
func newMemoryReturner(reg prometheus.Registerer, log *zap.Logger, conns func() int64) *memoryReturner {
	r := &memoryReturner{
		every: 10 * time.Second,
		spike: 2000,
		log:   log,
		returns: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "svcproxy", Subsystem: "memory", Name: "returns_total",
			Help: "Times memory was handed back to the kernel after a load spike ended or a large configuration shrank.",
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
		configSpike: 5000, // about 15 MiB of heap
		configGap:   time.Minute,
		now:         time.Now,
	}
	reg.MustRegister(r.returns)
	return r
}

// Applied records the snapshot a sync has just applied: its size is the
// configuration signal.
func (r *memoryReturner) Applied(snap *lb.Snapshot) {
	size := 0
	for _, b := range snap.Balancers() {
		size += 1 + len(b.Service.Endpoints)
	}
	r.mu.Lock()
	r.config, r.configHigh = size, max(r.configHigh, size)
	r.mu.Unlock()
}

// Run samples the signals every r.every until ctx ends.
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

	configReturn time.Time // when memory was last returned for a shrink
}

// step takes one sample of each signal.
func (r *memoryReturner) step(st *returnState) {
	n := r.count()
	st.high, st.peak = max(st.high, n), max(st.peak, n)
	if st.peak >= r.spike && 2*n < st.high {
		r.give("returned memory after a load spike", zap.Int("goroutines_high", st.high), zap.Int("goroutines", n))
		st.high = n
		if 4*n < r.spike {
			st.peak = n // at rest: the next spike must be a spike again
		}
	}

	r.mu.Lock()
	size, high := r.config, r.configHigh
	r.mu.Unlock()
	if high < r.configSpike || 2*size >= high {
		return
	}
	if now := r.now(); st.configReturn.IsZero() || now.Sub(st.configReturn) >= r.configGap {
		r.give("returned memory after the configuration shrank", zap.Int("size_high", high), zap.Int("size", size))
		st.configReturn = now
		r.mu.Lock()
		r.configHigh = r.config // from here; a larger one applied meanwhile counts again
		r.mu.Unlock()
	}
}

// give hands memory back and says why.
func (r *memoryReturner) give(why string, fields ...zap.Field) {
	start := time.Now()
	r.free()
	r.returns.Inc()
	r.log.Debug(why, append(fields, zap.Duration("took", time.Since(start)))...)
}

// SetOOMScoreAdj writes adj, if set, to path (/proc/self/oom_score_adj).
func SetOOMScoreAdj(path string, adj *int) error {
	if adj == nil {
		return nil
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(*adj)), 0); err != nil {
		return fmt.Errorf("setting oom_score_adj to %d: %w", *adj, err)
	}
	return nil
}
