package forwarder

// timers is an event loop's deadlines: a binary min-heap of timers embedded
// in the objects they belong to, so arming one allocates nothing. The loop
// waits until the earliest deadline at most, then fires what is due. It is
// not safe for concurrent use: one loop owns it.
type timers struct {
	h []*timer
}

// timer is one deadline in a timers heap. when is in the loop's monotonic
// nanoseconds; idx is its place in the heap, -1 when not armed.
type timer struct {
	when int64
	idx  int
	kind timerKind
	c    *relay        // the connection it belongs to (dial, idle, drain)
	ln   *loopListener // the listener it belongs to (accept back-off)
	u    *loopFlow     // the UDP flow it belongs to (idle)
}

type timerKind uint8

const (
	timerDial timerKind = iota + 1
	timerIdle
	timerDrain
	timerAccept
	timerKeepalive
	timerFirstByte
	timerOffload // an offloaded half waits for the kernel's bytes to be out before its FIN
	timerUDPIdle
)

func (t *timer) armed() bool { return t.idx >= 0 }

// set arms t at when, moving it if it is armed already.
func (ts *timers) set(t *timer, when int64) {
	if t.idx >= 0 {
		t.when = when
		ts.fix(t.idx)
		return
	}
	t.when = when
	t.idx = len(ts.h)
	ts.h = append(ts.h, t)
	ts.up(t.idx)
}

// stop disarms t; stopping a disarmed timer does nothing.
func (ts *timers) stop(t *timer) {
	i := t.idx
	if i < 0 {
		return
	}
	last := len(ts.h) - 1
	if i != last {
		ts.swap(i, last)
	}
	ts.h[last] = nil
	ts.h = ts.h[:last]
	t.idx = -1
	if i != last {
		ts.fix(i)
	}
}

// next is the earliest deadline, and false when no timer is armed.
func (ts *timers) next() (int64, bool) {
	if len(ts.h) == 0 {
		return 0, false
	}
	return ts.h[0].when, true
}

// pop disarms and returns the earliest timer if it is due at now.
func (ts *timers) pop(now int64) *timer {
	if len(ts.h) == 0 || ts.h[0].when > now {
		return nil
	}
	t := ts.h[0]
	ts.stop(t)
	return t
}

func (ts *timers) fix(i int) {
	if !ts.down(i) {
		ts.up(i)
	}
}

func (ts *timers) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if ts.h[p].when <= ts.h[i].when {
			return
		}
		ts.swap(i, p)
		i = p
	}
}

// down sifts i down and reports whether it moved.
func (ts *timers) down(i int) bool {
	start, n := i, len(ts.h)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && ts.h[r].when < ts.h[l].when {
			m = r
		}
		if ts.h[i].when <= ts.h[m].when {
			break
		}
		ts.swap(i, m)
		i = m
	}
	return i > start
}

func (ts *timers) swap(i, j int) {
	ts.h[i], ts.h[j] = ts.h[j], ts.h[i]
	ts.h[i].idx = i
	ts.h[j].idx = j
}
