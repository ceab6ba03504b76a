package forwarder

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestTimers arms, moves and stops timers at random and checks that they
// fire in deadline order, each once, and stopped ones never.
func TestTimers(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		var ts timers
		all := make([]timer, 1+rng.IntN(60))
		want := map[*timer]int64{}
		for i := range all {
			all[i].idx = -1
		}
		for range 3 * len(all) {
			tm := &all[rng.IntN(len(all))]
			switch rng.IntN(3) {
			case 0, 1:
				when := rng.Int64N(1000)
				ts.set(tm, when)
				want[tm] = when
			case 2:
				ts.stop(tm)
				delete(want, tm)
			}
		}
		var fired []int64
		now := int64(0)
		for now < 1000+7 {
			tm := ts.pop(now)
			if tm == nil {
				now += 7
				continue
			}
			w, ok := want[tm]
			if !ok {
				t.Fatalf("round %d: a stopped or fired timer fired", round)
			}
			if tm.when != w || w > now {
				t.Fatalf("round %d: timer for %d fired at %d (when %d)", round, w, now, tm.when)
			}
			delete(want, tm)
			fired = append(fired, w)
		}
		if len(want) != 0 {
			t.Fatalf("round %d: %d armed timers never fired", round, len(want))
		}
		if !slices.IsSorted(fired) {
			t.Fatalf("round %d: fired out of order: %v", round, fired)
		}
		if _, ok := ts.next(); ok {
			t.Fatalf("round %d: heap not empty", round)
		}
	}
}
