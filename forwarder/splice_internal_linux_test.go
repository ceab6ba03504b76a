package forwarder

import (
	"runtime"
	"testing"
	"time"
)

// TestShedPipes: idle pooled pipes are closed on demand (accept does it
// when out of file descriptors) and counted as freed descriptors.
func TestShedPipes(t *testing.T) {
	closeIdlePipes(t) // whatever other tests left
	before := livePipes.Load()
	var ps []*pipe
	for range 3 {
		p := getPipe()
		if p == nil {
			t.Fatal("no pipe")
		}
		ps = append(ps, p)
	}
	if got := livePipes.Load() - before; got != 3 {
		t.Fatalf("%d pipes alive, want 3", got)
	}
	for _, p := range ps {
		putPipe(p)
	}
	// The race detector makes sync.Pool drop a quarter of what is put;
	// a dropped pipe is closed by its finalizer instead.
	if freed := shedPipes(); freed > 6 || freed%2 != 0 || (!raceEnabled && freed != 6) {
		t.Errorf("shedPipes freed %d descriptors, want 6 (three idle pipes)", freed)
	}
	deadline := time.Now().Add(5 * time.Second)
	for livePipes.Load() != before && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if got := livePipes.Load(); got != before {
		t.Errorf("%d pipes alive after shedding, want %d", got, before)
	}
	if freed := shedPipes(); freed != 0 {
		t.Errorf("a second shedPipes freed %d", freed)
	}
}

// closeIdlePipes closes every pooled pipe, including those in other Ps'
// private pool slots, which shedPipes cannot reach: two collections empty
// the pool and the finalizers close them. No other pipe may be open but
// those the process inherited: the test backends copy without splice
// (copyPlain), as pipes in Go's own splice pool would close, freeing
// descriptors, whenever the collector likes. No connection may be moving
// bytes.
func closeIdlePipes(t testing.TB) {
	t.Helper()
	waitFor(t, "idle splice pipes closed", func() bool {
		shedPipes()
		runtime.GC()
		return livePipes.Load() == 0 && openPipes(t) == 0
	})
}
