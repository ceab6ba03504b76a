package forwarder

import (
	"encoding/binary"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"
)

// TestParkingEpoll: the epoll in Go's netpoller (the parking epoll)
// reports the worker's epoll only while the worker is parked. Events that
// come while it runs wake no other thread (each such wakeup cost two
// context switches on the CPU the worker's peers need: thousands a second
// under a bulk stream), and arming it again with events already waiting
// reports them at once, so no wakeup is lost; a wake with nothing
// reported (a timer's) leaves it disarmed too. Read from the kernel with
// poll(2) on the parking epoll, readable exactly when it has a report for
// the netpoller.
func TestParkingEpoll(t *testing.T) {
	w := newIdleWorker(t, zap.NewNop())
	reports := func() bool {
		t.Helper()
		fds := []unix.PollFd{{Fd: int32(w.park), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	event := func() { // something for the worker's epoll: its eventfd
		t.Helper()
		if _, err := unix.Write(w.evfd, binary.NativeEndian.AppendUint64(nil, 1)); err != nil {
			t.Fatal(err)
		}
	}
	harvest := func() { // what the worker does once awake
		t.Helper()
		for {
			n, err := sysEpollPoll(w.ep, w.events)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
		}
		var b [8]byte
		_, _ = unix.Read(w.evfd, b[:])
	}
	steps := []struct {
		name string
		do   func()
		want bool
	}{
		{"a new worker is parked, nothing has come", func() {}, false},
		{"an event comes while parked", event, true},
		{"the worker wakes, its epoll not yet harvested", w.unpark, false},
		{"another event while it runs", event, false},
		{"it parks with events still waiting", func() { mustRearm(t, w) }, true},
		{"it wakes and harvests everything", func() { w.unpark(); harvest() }, false},
		{"it parks with nothing waiting", func() { mustRearm(t, w) }, false},
		{"a timer wakes it, nothing reported", w.unpark, false},
		{"an event while it runs after a timer's wake", event, false},
		{"it parks with that event still waiting", func() { mustRearm(t, w) }, true},
		{"it wakes and harvests everything, again", func() { w.unpark(); harvest() }, false},
		{"it parks with nothing waiting, again", func() { mustRearm(t, w) }, false},
		{"an event comes while parked, again", event, true},
	}
	for _, s := range steps {
		s.do()
		if got := reports(); got != s.want {
			t.Fatalf("%s: the parking epoll reports %v, want %v", s.name, got, s.want)
		}
	}
}

func mustRearm(t *testing.T, w *worker) {
	t.Helper()
	if err := w.rearm(); err != nil {
		t.Fatal(err)
	}
}

// TestCannotParkLogsOnce: a worker whose parking epoll refuses to be armed
// keeps polling rather than risk never waking, and says so once, not at
// every turn of that spin; once it parks again, a new failure is said again.
func TestCannotParkLogsOnce(t *testing.T) {
	core, logs := observer.New(zap.ErrorLevel)
	w := newIdleWorker(t, zap.New(core))
	stray, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC) // does not hold w.ep: MOD fails
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(stray)
	park := w.park
	for _, step := range []struct {
		name     string
		park     int
		parks    bool
		wantLogs int
	}{
		{"refused", stray, false, 1},
		{"refused again", stray, false, 1},
		{"and again", stray, false, 1},
		{"parks", park, true, 1},
		{"refused after parking", stray, false, 2},
		{"refused still", stray, false, 2},
	} {
		w.park = step.park
		if parked := !w.poll(0); parked != step.parks {
			t.Errorf("%s: parked %v, want %v", step.name, parked, step.parks)
		}
		if n := logs.FilterMessageSnippet("cannot park").Len(); n != step.wantLogs {
			t.Errorf("%s: %d errors logged, want %d", step.name, n, step.wantLogs)
		}
		w.yield = false
	}
	w.park = park
}

// newIdleWorker makes a worker whose goroutine never runs, for tests that
// drive its parking by hand; its descriptors are closed at the test's end.
func newIdleWorker(t *testing.T, log *zap.Logger) *worker {
	t.Helper()
	w, err := newWorker(&loopEngine{f: &Forwarder{log: log}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.file.Close()
		unix.Close(w.ep)
		unix.Close(w.evfd)
	})
	return w
}
