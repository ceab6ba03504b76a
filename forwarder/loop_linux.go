package forwarder

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/lb"
)

// The event loop
//
// loopEngine runs Workers event loops. Each worker owns an epoll instance,
// one SO_REUSEPORT socket of every listening address, and every connection
// accepted there: both of its sockets, its timers and its state machine
// (relay_linux.go). Nothing about a connection is shared between workers,
// so a connection costs no lock, no goroutine and no channel.
//
// # How a worker waits
//
// A worker is a goroutine, not a locked OS thread. An epoll file
// descriptor is itself pollable, so the worker waits for its epoll in Go's
// own netpoller (os.NewFile of a non-blocking epoll fd) with
// (syscall.RawConn).Read: the callback harvests the worker's epoll with a
// zero timeout, handles what it got, and returns false to park the
// goroutine until the netpoller sees it readable again. Timers are the
// file's read deadline. Measured against the alternatives on this kind of
// machine (../shared/FACTS.md, a 250-line prototype of each, ratios
// against nginx stream in the same run):
//
//	how a worker waits                                  keep-alive req/s  CPU/req  new conn/s  p99
//	blocking epoll_wait, LockOSThread                   0.77×             1.76×    0.82×       81 ms
//	  + raw read/write, a non-blocking poll first       0.69×             1.98×    0.67×       159 ms
//	blocking epoll_wait, no LockOSThread                0.73×             1.63×    0.76×       30 ms
//	epoll fd in Go's netpoller (this)                   0.95×             1.04×    0.84×       11 ms
//
// A blocking epoll_wait makes the runtime hand the worker's P to another
// thread and take it back at every wakeup, and LockOSThread adds a thread
// switch to each: that, not Go code, was the cost. In the netpoller the
// worker parks like any goroutine waiting for a socket.
//
// # The parking epoll
//
// The file in the netpoller is not the worker's epoll but a second one, the
// parking epoll, which holds the worker's epoll as a one-shot entry: armed
// as the worker parks (rearm: EPOLL_CTL_MOD, which reports at once if events
// are already waiting), disarmed as it wakes by reading the report (unpark;
// after a wake with nothing reported, a timer's, by a MOD with an empty mask
// and a second read). While the worker runs, its sockets' events wake
// nobody. No wakeup is lost: an event that comes after the worker's last
// harvest either finds the entry armed and wakes the netpoller, or comes
// before the MOD, which reports it; and should the entry still be on the
// parking epoll's ready list at the MOD (which then reports nothing new),
// the event that put it there woke the netpoller, whose own poll of the
// parking epoll then reports it or takes it off.
//
// The worker's epoll in the netpoller directly woke the netpoller at every
// event, parked or not: each time a socket of a busy worker became ready, a
// thread blocked in the netpoller (on the other CPU, which the client and
// backend need) woke, found the worker running, and slept again. Under one
// bulk stream (svcproxy-vip, perf over 2 s) the netpoller blocked and woke
// 3,400 times a second while the worker harvested its epoll 1,060 times;
// with the parking epoll, 6.1k context switches in 5 s against 16.7k
// (HAProxy: 2.8–4.7k), and half the epoll waits. In the bench's bulk, 1 MiB
// and keep-alive tests (2026-11-28, svcproxy-vip against HAProxy in the same
// turns, 5 turns of 4 s, medians of the ratios, before → after): bulk on one
// stream 0.86× → 1.00× at 0.57–0.72 s of CPU per GB against 0.76–0.89, four
// streams 0.95× → 1.04×, 1 MiB transfers 0.79× → 0.93×, keep-alive requests
// 0.98× → 1.13× with the p99 1.79× → 1.10× HAProxy's and CPU per request
// 0.73× → 0.65×; new connections unchanged (1.12×, 1.11×). The full bench
// that followed (2026-11-28 05:45, 5 rounds) met bulk on one and four
// streams and 1 MiB against HAProxy on both footings; no run since
// 2026-11-27 had met all three, the three before it none (svcproxy-local
// 1.22×, 1.10×, 1.02×); the next (07:49) met bulk on one stream on both
// and missed 1 MiB on both (0.92×, 0.93×), within its rounds' spread
// (0.68–1.10×). Two system calls per park (the MOD,
// the read of the report), two more after a wake with nothing reported, none
// while busy.
//
// The same was first built with EPOLL_CTL_ADD before parking and DEL on
// waking, and measured with keep-alive only, where it changed nothing
// (2026-11-26: context switches per request 0.21–0.25 either way). ADD is
// also the wrong call for it: adding an epoll to an epoll that is itself
// watched makes the kernel check for loops by walking every descriptor the
// added one watches (ep_loop_check), under a global mutex, a cost per park
// that grows with the worker's connections. MOD of an entry already there
// takes no global lock and looks only at the worker's epoll's ready list.
//
// A further refinement was built into the engine and measured against it,
// A/B in turns (wrk, 64 keep-alive connections, 1 KiB responses, client,
// node and backend namespaces joined by veths, 4 turns of 5 s each), and
// dropped: on top of the parking epoll (then ADD/DEL), while busy, wait in
// a raw blocking epoll_pwait2 of up to 2 ms that keeps the P (the runtime
// never sees it), GOMAXPROCS raised by the worker count; park in the
// netpoller only after 2 ms of nothing. CPU per request 15–22 µs against
// 13–19 µs, and a p99 over 900 ms in 2 of 4 turns. Context switches per
// request doubled (0.37–0.46 against 0.20–0.24): a thread that blocks in
// the kernel at once switches at every wait, where the runtime, before it
// blocks in the netpoller, spins briefly and often finds the next event
// first.
//
// Not parking at all was measured too (2026-11-27, io_uring on): when a
// harvest comes back empty, one sched_yield and one more harvest before
// parking, or more harvests for up to 20 µs. In the rig above both served
// 10–19 % more keep-alive requests at a quarter less CPU per request (a
// park and its wake cost more than the yield or the spin), but the bench
// (4 rounds, against nginx stream and HAProxy in the same runs) put the
// keep-alive p99 at 1.2–420× the better peer's (median 26×) with the
// yield and 3–19× (median 13×) with the spin, where the parking loop is
// at 0.8–1.2×: under EEVDF each yield pushes the thread's deadline a slice
// later, and a spinning thread spends the slice the client and backend
// need, so some connections wait tens to hundreds of milliseconds. Both
// dropped.
//
// In the same rig, over 12 turns against nginx stream, svcproxy served
// 0.93–1.24× its keep-alive requests (median 1.08×) at 0.75–1.10× its CPU
// per request (median 0.88×); the bench, 10 rounds, says 1.02× and 0.94×.
// perf puts 68 % of the loop's CPU under write(2) (it carries the
// receiving namespace's softirq and wakeups), 13 % in the scheduler's
// wait, and under 3 % in Go code.
//
// Fewer loops were measured too (2026-11-27, the bench's keep-alive and
// bulk tests, svcproxy-userspace against HAProxy in the same turns, 11
// turns over three runs): GOMAXPROCS=1 with one worker, GOMAXPROCS=1 with
// two, and one worker with two Ps. Each cut the CPU per keep-alive request
// by 10–24 % (medians per run 18.9–22.3 µs against 23.7–24.8 µs with a
// loop per P), likely because with one loop a harvest finds more ready
// connections (each io_uring_enter and epoll_pwait serves more requests)
// and with one P the runtime wakes no idle thread. Requests per second
// did not follow (medians per run 0.89–1.10× HAProxy's against
// 0.83–1.02×, in no consistent order), because on this rig the client and
// the backend, not the proxy, hold the cores; and one loop caps the proxy
// at one core on a node that has more. Not adopted: a loop per P stays.
//
// Where the rest of the keep-alive gap sits (2026-11-28, the bench's
// keep-alive test, svcproxy-local, /proc/stat over 5 s, 4 samples): the
// two cores are 9–12 % idle, where with nginx stream or HAProxy in its
// place they are 0–1 % idle. perf's sched_switch events put the start of
// nearly every idle period at a svcproxy thread blocking, the netpoller's
// epoll_pwait (94 µs on average) or an idle M's futex, and its end at a
// svcproxy thread waking. The netpoller wakes whichever thread waits in it,
// so a worker has no CPU of its own: in one sample both workers' threads
// shared one CPU (62 % of it) while the client and a backend held the
// other, where nginx's processes each settle beside a client thread and a
// backend worker. Pinning each worker to a CPU was built and measured
// (LockOSThread, sched_setaffinity, a blocking epoll_wait on the worker's
// own epoll; 4 turns, svcproxy-local against the same binary unpinned):
// idle fell to 2 %, but requests/s fell to 23.6k against 33.2k and CPU
// per request rose to 35 µs against 19.5 µs, as the runtime's monitor and
// P hand-offs around each blocking wait kept two more threads switching
// thousands of times a second. An extra P (GOMAXPROCS=3, two workers,
// 5 turns) did no better either. Not adopted; that idle CPU, not the
// loop's own cost, is the likeliest reason keep-alive stays at parity with
// nginx stream rather than above it. On the Intel Xeon VM (2026-11-28
// evening, /proc/stat over the bench's keep-alive test, svcproxy-vip and
// nginx stream in the same runs, 3 to 8 rounds): 0.9–1.4 µs of idle CPU
// per request against nginx's 0.1–0.7 (4–6 % of the two cores against
// 1–3 %), at 8.0–8.6 µs of proxy CPU per request each, the same two
// segments in and out per request at the node, and fewer context switches
// per request than nginx (0.08 against 0.16). One perf sched sample put
// the average wait of a runnable thread at 0.15 ms for svcproxy's and the
// client's and 0.07 ms for the backend's, against 0.04 ms for every
// thread with nginx stream in svcproxy's place.
//
// One cause is in the runtime: a thread that wakes from the netpoller with
// a worker to run takes an idle P and runs it without waking another
// thread (findRunnable, Go 1.26), so while that worker runs, no thread
// waits in the netpoller and the other worker's events wait until a
// thread looks (this one, when its worker parks) while the other CPU may
// idle. Waking a thread for the netpoller at each unpark was measured
// (2026-11-28: a send to a goroutine blocked on a channel, whose readying
// wakes an idle P's thread, which then waits in the netpoller; 6 turns,
// svcproxy-vip against the same binary without, ratios to HAProxy in the
// same turns, medians): 1.05× HAProxy's keep-alive requests against 1.20×,
// at 21.6 µs of CPU per request against 20.2, the p99 1.06× against
// 1.00×. The woken thread spins and switches on the CPU the client and
// backend need. Not adopted.
//
// Edge-triggered registration with EPOLLRDHUP is what saves the system
// calls Go's poller cannot: a read shorter than the buffer means the
// socket is empty (no read to see EAGAIN), and a FIN queued with the last
// bytes is known from the event, so the relay half-closes without another
// read.
//
// # Batching through io_uring
//
// With Config.IOUring (the default where the kernel allows it) a worker
// does not read and write each message as epoll reports it: it notes the
// connections the harvest found ready and then, in rounds of up to 64
// halves, reads every ready half into a slot of its own with one
// io_uring_enter and writes what it read with a second (batch_linux.go).
// Two system calls per round instead of two per message; perf and strace
// put the rest of the cost in the TCP stack either way. The operations
// carry MSG_DONTWAIT on non-blocking sockets, so the kernel runs them
// inline in the submit and never arms io_uring's own poll: readiness
// stays epoll's, nothing completes later, and no task_work or kernel
// thread is involved. Anything other than a small message between two idle
// halves (bytes held back, a bulk stream, an end to pass on, an offloaded
// connection) goes through the relay's pump as before, and the pump runs
// after each round to finish what the round began.
//
// Measured first with a throwaway program (32 connected loopback TCP
// pairs, a 1 KiB write on each then a read on each, CPU time per
// operation, 3 turns): write(2)/read(2) 3.9–4.5 µs, io_uring batches of
// 32 3.1–3.5 µs, batches of 8 3.4–3.9 µs against 4.0–4.3 µs — about
// 0.7 µs less per operation, several times a bare system call's 0.19 µs on
// this machine (the write path's file layers, and the mitigations' cost
// at every kernel exit). In the keep-alive rig above (4 turns of 5 s, the
// same binary with --io-uring=off, then on, then nginx stream): CPU per
// request 15.3–18.5 µs against 20.4–27.1 µs without, and nginx's
// 24.1–25.6 µs; context switches per request 0.15–0.31 against 0.37–0.47.
// The bench (5 rounds, 2026-11-27 00:08): CPU per keep-alive request
// 0.81× nginx stream's and 0.4 system calls per request, against 1.05×
// and 4.0 in the last run without (21:10 the day before); keep-alive
// requests/s 1.04× against 0.91×.
//
// # Why not gnet or cloudwego/netpoll
//
// Both run their own epoll loops in Go, but they own the sockets: neither
// makes outbound non-blocking connects in the loop that accepted the
// client (gnet v2 has no client side in the loop at all; netpoll dials
// through its own blocking-looking API), neither moves bytes between two
// raw descriptors with splice, and neither hands over listening sockets
// to a successor. svcproxy needs all of those and SO_ORIGINAL_DST/SO_MARK
// on the raw descriptors, so the loop is written on golang.org/x/sys/unix,
// which the forwarder already uses.
//
// # Cross-goroutine work
//
// Apply, Shutdown and the listener changes reach a worker as tasks: a
// closure queued under a mutex and an eventfd write that wakes the loop.
// Tasks are rare (per snapshot, not per connection).
//
// # Balancing connections across workers
//
// The kernel gives each connection to one worker's SO_REUSEPORT socket by
// a hash of its addresses, not by load. Many short connections even out;
// a few long-lived ones (a client's keep-alive pool, gRPC channels) can
// land two to one and stay there: measured under the bench's keep-alive
// test, 64 connections over two workers split 22/42 in one run, and the
// test below sees splits such as 10/20/15/19 over four. So a worker that
// accepts a connection while another has clearly fewer (two fewer, and a
// sixteenth of its own) hands it over (lighter, adopt): it reads the
// original destination, queues the descriptor and the addresses to the
// lighter worker under that worker's mutex, and wakes it through the
// eventfd, as tasks do; the queue is reused, so a hand-over allocates
// nothing. Each worker publishes its count in an atomic, which the
// others read at accept. HAProxy's accept queues (the least loaded of
// two threads) and Envoy's exact_balance do the same; --worker-balance=off
// turns it off. The slack keeps short connections, whose counts come and
// go, mostly on the worker that accepted them. Measured A/B (2026-11-28,
// the bench's tests, the same binary without hand-overs as the other
// side, ratios against HAProxy in the same turns, medians): svcproxy-local
// (6 turns) keep-alive p99 0.97× against 1.07×, requests/s 1.19× against
// 1.16×, new connections 1.05× against 1.06×; svcproxy-vip (5 turns,
// nginx stream in the turns too) keep-alive p99 1.09× against 1.25× both
// peers', requests/s 0.95× against 0.97× nginx stream's. The p99 moved
// both times; the rates stayed within the noise. The full bench that
// followed (2026-11-28 09:08, round by round against the better peer, in
// brackets the two runs before it) did not settle it: svcproxy-vip's
// keep-alive 1.04× (0.93×) with its p99 1.08× (1.20×), svcproxy-local's
// 0.96× (1.05×) with 1.47× (1.11×); new connections, A/B alone (8
// turns), 1.05× HAProxy's with the hand-over and 1.03× without. A third
// keep-alive A/B (svcproxy-local, 6 turns, against the better of HAProxy
// and nginx stream) saw no difference: p99 1.27× against 1.29×,
// requests/s 0.96× against 0.98×. It is kept because it corrects a split
// that is measured and real; on this 2-core rig its gain is not shown.

const (
	loopEvents  = 256 // epoll events harvested per call
	acceptBatch = 64  // connections accepted per listener per turn
)

// loopEpoch anchors the loops' monotonic clock.
var loopEpoch = time.Now()

// monotime is nanoseconds since loopEpoch, monotonic.
func monotime() int64 { return int64(time.Since(loopEpoch)) }

type loopEngine struct {
	f            *Forwarder
	off          Offloader                  // nil: no offload
	ownOff       interface{ Close() error } // the Sockmap the engine loaded, closed at stop
	upstreamOpts []sockopt                  // keepalive options of every upstream socket
	workers      []*worker
	nextUDP      atomic.Uint32 // the worker the next UDP frontend goes to, in turn
	wg           sync.WaitGroup
	stopOnce     sync.Once
}

func newLoopEngine(f *Forwarder) (*loopEngine, error) {
	e := &loopEngine{f: f}
	if f.cfg.KeepAlive > 0 { // new sockets start without keepalive
		e.upstreamOpts = keepaliveOpts(f.cfg.KeepAlive, false)
	}
	if f.cfg.Offload == OffloadSockmap {
		e.startOffload()
	}
	uring := e.off == nil && f.cfg.IOUring == IOUringAuto
	for i := 0; i < f.cfg.Workers; i++ {
		w, err := newWorker(e, i)
		if err != nil {
			e.start() // the ones made, so that stop ends them
			e.stop()
			return nil, err
		}
		if uring {
			if w.batch, err = newBatch(); err != nil {
				// A kernel without io_uring, io_uring_disabled, or a seccomp
				// profile that refuses it (container runtimes' defaults do).
				f.log.Info("io_uring refused; the event loop makes a read and a write per message", zap.Error(err))
				uring = false
			} else {
				f.m.IOUringWorkers.Inc()
			}
		}
		e.workers = append(e.workers, w)
	}
	e.start()
	return e, nil
}

// start runs the workers' goroutines, once all are made: each reads the
// others' counts (lighter).
func (e *loopEngine) start() {
	for _, w := range e.workers {
		e.wg.Add(1)
		go w.run()
	}
}

// stop ends the workers; connections still open are closed.
func (e *loopEngine) stop() {
	e.stopOnce.Do(func() {
		for _, w := range e.workers {
			w.post(func(w *worker) { w.quit = true })
		}
		e.wg.Wait()
		if e.ownOff != nil {
			if err := e.ownOff.Close(); err != nil {
				e.f.log.Warn("cannot free the sockmap offload", zap.Error(err))
			}
		}
	})
}

// each runs fn on every worker and waits for all of them. Never call it
// from a worker.
func (e *loopEngine) each(fn func(w *worker)) {
	var wg sync.WaitGroup
	for _, w := range e.workers {
		wg.Add(1)
		w.post(func(w *worker) { fn(w); wg.Done() })
	}
	wg.Wait()
}

func (e *loopEngine) drain(snap *lb.Snapshot) {
	for _, w := range e.workers {
		w.post(func(w *worker) {
			for _, r := range w.relays {
				if r.state == relayOpen && !r.draining && !snap.HasEndpoint(r.pool.Service.Name, r.backend.Addr) {
					r.startDrain()
				}
			}
		})
	}
}

func (e *loopEngine) killAll(reason closeReason) int {
	var mu sync.Mutex
	n := 0
	e.each(func(w *worker) {
		k := 0
		for len(w.relays) > 0 {
			w.relays[len(w.relays)-1].kill(reason)
			k++
		}
		mu.Lock()
		n += k
		mu.Unlock()
	})
	return n
}

// fdEntry is what a worker knows of one of its file descriptors. Events
// carry the descriptor and seq, so an event still queued for a descriptor
// that was closed and reused is recognised and dropped.
type fdEntry struct {
	seq      uint32
	upstream bool // r's upstream socket; else its client socket
	r        *relay
	ln       *loopListener
	ufe      *loopUDP  // a UDP frontend's socket
	ufl      *loopFlow // a UDP flow's backend socket
}

// worker is one event loop. Everything but conns, closing and what mu
// guards belongs to its goroutine.
type worker struct {
	e   *loopEngine
	f   *Forwarder
	log *zap.Logger

	ep     int      // epoll
	file   *os.File // park, in Go's netpoller
	rc     syscall.RawConn
	pollFn func(uintptr) bool
	evfd   int  // eventfd: tasks are queued
	park   int  // the parking epoll, the one in the netpoller: reports ep once per arming
	parked bool // park was armed when the worker last parked and is not read yet
	parkEv [1]unix.EpollEvent

	events     []unix.EpollEvent
	buf        []byte // small messages pass through here
	fds        []fdEntry
	seq        uint32
	timers     timers
	now        int64 // monotime at the last harvest
	armed      int64 // the read deadline set on file: 0 none, -1 passed
	quit       bool
	yield      bool // poll returned with work left, to let other goroutines run
	unparkable bool // the last rearm failed (and was logged)

	relays []*relay        // open connections, dialling ones included
	free   []*relay        // finished, for reuse
	again  []*loopListener // listeners with more connections to accept
	busy   []relayRef      // relays that used up a turn with bytes still to move

	// UDP (udp_loop_linux.go), allocated with the first UDP frontend.
	udpRx     *udpBatchBufs // clients' datagrams
	udpTx     *udpBatchBufs // replies gathered for one sendmmsg
	udpTxN    int           // replies in udpTx
	udpTxFE   *loopUDP      // the frontend they go out of
	udpTxFlow [udpBatch]*loopFlow
	udpAgain  []*loopUDP // frontends that used up a turn with datagrams maybe left

	batch   *batch // batched relay I/O (batch_linux.go); nil: a system call per message
	retired []byte // the slots of a ring given up (batchFailed)

	rsa unix.RawSockaddrAny // accept's peer address
	sa4 unix.RawSockaddrInet4
	sa6 unix.RawSockaddrInet6

	// conns counts the connections this worker serves or has been handed
	// and not yet taken: what other workers read to balance (lighter).
	conns atomic.Int32
	// closing is set once the loop has ended: no connection is handed to
	// it from then on.
	closing atomic.Bool

	mu       sync.Mutex
	tasks    []func(*worker)
	adopts   []adoption // connections other workers handed over
	adopting []adoption // the list being taken, kept for reuse
	woken    bool
	dead     bool // the goroutine has ended: tasks run at once
}

// adoption is a connection accepted and not yet served: by the worker that
// accepted it, or by another it was handed to.
type adoption struct {
	fd          int
	id          uint64    // the connection's, in accept order
	start       time.Time // accepted
	client, dst netip.AddrPort
}

func newWorker(e *loopEngine, id int) (*worker, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("creating epoll instance: %w", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(ep)
		return nil, fmt.Errorf("creating eventfd: %w", err)
	}
	w := &worker{e: e, f: e.f, log: e.f.log.With(zap.Int("worker", id)), ep: ep, evfd: evfd,
		events: make([]unix.EpollEvent, loopEvents), buf: make([]byte, bufferSize)}
	if err := w.register(evfd, fdEntry{}, unix.EPOLLIN|unix.EPOLLET); err != nil {
		unix.Close(ep)
		unix.Close(evfd)
		return nil, err
	}
	park, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err == nil {
		if err = unix.SetNonblock(park, true); err == nil {
			ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLONESHOT}
			err = unix.EpollCtl(park, unix.EPOLL_CTL_ADD, ep, &ev)
		}
		if err != nil {
			unix.Close(park)
		}
	}
	if err != nil {
		unix.Close(ep)
		unix.Close(evfd)
		return nil, fmt.Errorf("creating the parking epoll instance: %w", err)
	}
	w.park, w.parked = park, true
	// The netpoller takes a non-blocking descriptor as pollable.
	w.file = os.NewFile(uintptr(park), fmt.Sprintf("epoll(worker %d parking)", id))
	if w.rc, err = w.file.SyscallConn(); err != nil {
		w.file.Close()
		unix.Close(ep)
		unix.Close(evfd)
		return nil, fmt.Errorf("waiting for epoll in the netpoller: %w", err)
	}
	w.pollFn = w.poll
	return w, nil
}

// run is the worker's goroutine.
func (w *worker) run() {
	defer w.e.wg.Done()
	for !w.quit {
		err := w.rc.Read(w.pollFn)
		switch {
		case err == nil:
			if w.yield {
				w.yield = false
				runtime.Gosched()
			}
		case errors.Is(err, os.ErrDeadlineExceeded):
			// The deadline stays passed until it is set again, and Read
			// fails before calling poll while it is: set it here.
			w.armed = -1
			w.now = monotime()
			w.fire()
			w.arm()
		default:
			w.log.Error("event loop failed; its connections are closed", zap.Error(err))
			w.quit = true
		}
	}
	// No connection is handed to this worker from here on; those handed
	// to it before go to a worker still running.
	w.closing.Store(true)
	w.mu.Lock()
	adopts := w.adopts
	w.adopts = nil
	w.mu.Unlock()
	for _, a := range adopts {
		w.conns.Add(-1)
		w.e.rehome(w, a)
	}
	for len(w.relays) > 0 {
		w.relays[len(w.relays)-1].kill(reasonShutdown)
	}
	for fd := range w.fds {
		if ln := w.fds[fd].ln; ln != nil {
			ln.closeNow()
		}
		if fe := w.fds[fd].ufe; fe != nil {
			w.udpClose(fe)
		}
	}
	if w.batch != nil {
		w.batch.close()
		w.f.m.IOUringWorkers.Dec()
	}
	w.file.Close()
	unix.Close(w.ep)
	w.mu.Lock()
	w.dead = true
	tasks := w.tasks
	w.tasks = nil
	w.mu.Unlock()
	unix.Close(w.evfd)        // no post writes to it now (see wake)
	for _, t := range tasks { // a waiter must not hang on a worker that is gone
		t(w)
	}
}

// poll is the RawConn.Read callback: harvest, handle, and report whether to
// return (true) or park until the epoll fd is readable again (false).
func (w *worker) poll(uintptr) bool {
	w.unpark()
	for {
		n, err := sysEpollPoll(w.ep, w.events)
		if err != nil && err != unix.EINTR {
			w.log.Error("epoll_wait failed", zap.Error(err))
			return true
		}
		if n > 0 {
			w.now = monotime()
			w.dispatch(n)
			w.fire()
		}
		if len(w.again) > 0 || len(w.busy) > 0 || len(w.udpAgain) > 0 {
			w.acceptAgain()
			w.pumpBusy()
			w.udpReadAgain()
			w.udpFlush()
			if len(w.again) > 0 || len(w.busy) > 0 || len(w.udpAgain) > 0 {
				// Still more: let the goroutines sharing this P run first
				// (the loop's raw system calls never yield).
				w.yield = true
				return true
			}
			continue
		}
		if w.quit {
			return true
		}
		if n > 0 {
			// Under load more events have come while these were handled:
			// take them now rather than through a round trip of the
			// scheduler (park, netpoll, wake).
			continue
		}
		// Nothing is queued, and events that arrive from here on, or
		// came since the last harvest, make the armed parking epoll
		// report: parking loses none.
		w.arm()
		if err := w.rearm(); err != nil {
			// Cannot happen (the descriptors are the worker's own); were
			// it to, a worker that runs again is better than one that
			// may never wake. Said once, not at every turn of the spin.
			if !w.unparkable {
				w.unparkable = true
				w.log.Error("event loop cannot park; it polls without waiting until it can", zap.Error(err))
			}
			w.yield = true
			return true
		}
		w.unparkable = false
		return false
	}
}

// rearm arms the parking epoll to report the worker's epoll once: at once
// if it holds events already (EPOLL_CTL_MOD polls it), else at the next.
func (w *worker) rearm() error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLONESHOT}
	if err := sysEpollCtl(w.park, unix.EPOLL_CTL_MOD, w.ep, &ev); err != nil {
		return fmt.Errorf("arming the parking epoll: %w", err)
	}
	w.parked = true
	return nil
}

// unpark reads what the parking epoll reported since the worker parked.
// Reading a report is what disarms a one-shot entry, and what takes it off
// the parking epoll's ready list so that the next rearm reports anew.
func (w *worker) unpark() {
	if !w.parked {
		return
	}
	w.parked = false
	if n, _ := sysEpollPoll(w.park, w.parkEv[:]); n > 0 {
		return
	}
	// Nothing was reported (the deadline woke the worker, for a timer): the
	// entry is still armed, and every event would wake the netpoller while
	// the worker runs. Disarm it (nothing in its mask), then read once more,
	// which takes off the ready list a report that raced the disarm: left
	// there, it would keep the next rearm from reporting.
	ev := unix.EpollEvent{Events: unix.EPOLLONESHOT}
	_ = sysEpollCtl(w.park, unix.EPOLL_CTL_MOD, w.ep, &ev)
	_, _ = sysEpollPoll(w.park, w.parkEv[:])
}

// arm sets the parking epoll file's read deadline to the earliest timer.
func (w *worker) arm() {
	when, ok := w.timers.next()
	if !ok {
		when = 0
	}
	if when == w.armed {
		return
	}
	w.armed = when
	var d time.Time
	if ok {
		d = loopEpoch.Add(time.Duration(when))
	}
	_ = w.file.SetReadDeadline(d)
}

func (w *worker) dispatch(n int) {
	for i := 0; i < n; i++ {
		ev := &w.events[i]
		fd := int(ev.Fd)
		if fd == w.evfd {
			w.runTasks()
			continue
		}
		if fd >= len(w.fds) {
			continue
		}
		e := &w.fds[fd]
		if e.seq != uint32(ev.Pad) {
			continue // for a descriptor closed since
		}
		switch {
		case e.r != nil:
			e.r.event(e.upstream, ev.Events)
		case e.ln != nil:
			w.accept(e.ln)
		case e.ufl != nil:
			w.udpReply(e.ufl)
		case e.ufe != nil:
			w.udpRead(e.ufe)
		}
	}
	if w.batch != nil && len(w.batch.noted) > 0 {
		w.runBatch()
	}
	w.udpFlush()
}

// fire runs the timers that are due.
func (w *worker) fire() {
	for {
		t := w.timers.pop(w.now)
		if t == nil {
			return
		}
		switch t.kind {
		case timerDial:
			t.c.dialTimedOut()
		case timerIdle:
			t.c.idleCheck()
		case timerDrain:
			t.c.drainCheck()
		case timerKeepalive:
			t.c.keepalive()
		case timerFirstByte:
			t.c.firstByteTimedOut()
		case timerOffload:
			t.c.offloadCheck()
		case timerAccept:
			t.ln.paused = false
			w.accept(t.ln)
		case timerUDPIdle:
			w.udpIdle(t.u)
		}
	}
}

// register adds fd to the worker's epoll for events, remembering e.
func (w *worker) register(fd int, e fdEntry, events uint32) error {
	if fd >= len(w.fds) {
		n := max(2*len(w.fds), fd+1, 64)
		fds := make([]fdEntry, n)
		copy(fds, w.fds)
		w.fds = fds
	}
	w.seq++
	if w.seq == 0 {
		w.seq = 1
	}
	e.seq = w.seq
	w.fds[fd] = e
	ev := unix.EpollEvent{Events: events, Fd: int32(fd), Pad: int32(e.seq)}
	if err := sysEpollCtl(w.ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		w.fds[fd] = fdEntry{}
		return fmt.Errorf("adding descriptor to epoll: %w", err)
	}
	return nil
}

// closeFD forgets fd and closes it, which takes it out of the epoll when
// fd was the socket's last descriptor: a connection's.
func (w *worker) closeFD(fd int) {
	if fd < len(w.fds) {
		w.fds[fd] = fdEntry{}
	}
	sysClose(fd)
}

// closeShared takes fd out of the epoll, then closes it: a listener's or a
// UDP frontend's, whose socket a successor may hold a duplicate of. The
// epoll watches the socket, not the descriptor, until its last descriptor
// closes: left in, every connection or datagram the successor takes would
// wake this worker for nothing while it drains.
func (w *worker) closeShared(fd int) {
	_ = sysEpollCtl(w.ep, unix.EPOLL_CTL_DEL, fd, nil)
	w.closeFD(fd)
}

// post queues fn to run on the worker's goroutine.
func (w *worker) post(fn func(*worker)) {
	w.mu.Lock()
	if w.dead {
		w.mu.Unlock()
		fn(w)
		return
	}
	w.tasks = append(w.tasks, fn)
	w.wake()
	w.mu.Unlock()
}

// dupOwned duplicates fd, a socket of w's, for a successor process. It
// runs on w (or after w's loop ended, when w closed its sockets), where
// closed, the socket's flag, is read safely: a socket w has closed is never
// duplicated by its number, which may name another file by then. With
// skip (a flag of the socket's too) set, there is nothing to hand over:
// dup is -1 and err nil.
func (w *worker) dupOwned(fd int, closed, skip *bool) (dup int, err error) {
	done := make(chan struct{})
	w.post(func(*worker) {
		defer close(done)
		switch {
		case *closed:
			err = net.ErrClosed
		case skip != nil && *skip:
			dup = -1
		default:
			dup, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		}
	})
	<-done
	return dup, err
}

// wake makes the worker run its tasks and adoptions. Under mu: the worker
// closes evfd only once it is dead, and a write after the close could
// reach whatever took the number.
func (w *worker) wake() {
	if !w.woken {
		w.woken = true
		one := [8]byte{1}
		_, _ = sysWrite(w.evfd, one[:])
	}
}

// lighter returns the worker with the fewest connections if it has
// clearly fewer than w (two, and a sixteenth of w's), else nil: where w
// should hand a connection it has just accepted. SO_REUSEPORT spreads
// connections by a hash of their addresses, not by load, so a few
// long-lived ones (a client's keep-alive pool) can land two to one on
// one worker, and stay there; HAProxy's accept queues and Envoy's
// exact_balance correct the same. The slack keeps short connections,
// whose counts come and go, mostly where they were accepted. Measured
// again on the Intel Xeon VM (2026-11-28, against --worker-balance=off in
// the same runs, 16 rounds over three runs): keep-alive requests 0.95×
// to 1.05× by run, in no consistent direction, new connections, 1 MiB and
// bulk alike within the noise; kept for the few long connections it is
// for.
func (e *loopEngine) lighter(w *worker) *worker {
	if len(e.workers) < 2 || e.f.cfg.Unbalanced {
		return nil
	}
	mine := w.conns.Load()
	if o, n := e.lightest(w); o != nil && n <= mine-max(2, mine/16) {
		return o
	}
	return nil
}

// lightest returns the running worker other than w with the fewest
// connections (the first of a tie) and its count; nil when none runs.
func (e *loopEngine) lightest(w *worker) (best *worker, fewest int32) {
	for _, o := range e.workers {
		if o == w || o.closing.Load() {
			continue
		}
		if n := o.conns.Load(); best == nil || n < fewest {
			best, fewest = o, n
		}
	}
	return best, fewest
}

// rehome hands a connection queued to w, whose loop has ended, to the
// lightest worker still running; with none (the engine is stopping, its
// listeners closed), it resets the client.
func (e *loopEngine) rehome(w *worker, a adoption) {
	if best, _ := e.lightest(w); best != nil && best.adopt(a) {
		return
	}
	linger0(a.fd)
	sysClose(a.fd)
	e.f.handlers.Done()
}

// adopt queues a connection another worker accepted for this one to
// serve; false if this worker's loop has ended.
func (w *worker) adopt(a adoption) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dead || w.closing.Load() {
		return false
	}
	w.conns.Add(1)
	w.adopts = append(w.adopts, a)
	w.wake()
	return true
}

func (w *worker) runTasks() {
	var b [8]byte
	_, _ = sysRead(w.evfd, b[:])
	w.mu.Lock()
	tasks := w.tasks
	w.tasks = nil
	adopts := w.adopts
	w.adopts, w.adopting = w.adopting[:0], adopts
	w.woken = false
	w.mu.Unlock()
	for _, a := range adopts {
		w.conns.Add(-1) // serve counts it again
		w.serve(a)
	}
	for _, t := range tasks {
		t(w)
	}
}

// loopListener is one listening socket, owned by one worker.
type loopListener struct {
	w        *worker
	fd       int
	redirect bool
	local    netip.AddrPort // bound address; unspecified: read each connection's
	paused   bool           // out of descriptors: waiting for retry
	pending  bool           // bound; listens when accepting starts (see listen)
	backoff  time.Duration
	lastLog  int64
	retry    timer
	queued   bool // in w.again
	closed   bool
}

// loopListeners is one address's sockets, socket i on worker i.
type loopListeners struct {
	e       *loopEngine
	socks   []*loopListener
	started bool
}

func (e *loopEngine) listen(k listenKey, inherited func(i int) *os.File) (tcpListeners, error) {
	g := &loopListeners{e: e}
	addr := k.addr
	v6only := e.f.v6only(addr)
	fds := make([]int, len(e.workers)) // -1: not handed over, made below
	handed := false
	fail := func(err error) (tcpListeners, error) {
		for _, fd := range fds {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
		return nil, fmt.Errorf("listening on %v: %w", k.addr, err)
	}
	for i := range fds {
		fds[i] = -1
		file := inherited(i)
		if file == nil {
			continue
		}
		fd, err := adoptSocket(file)
		file.Close()
		if err != nil {
			return fail(err)
		}
		fds[i], handed = fd, true
		if addr.Port() == 0 { // the port is the handed-over socket's
			bound, err := sockName(fd)
			if err != nil {
				return fail(err)
			}
			addr = netip.AddrPortFrom(addr.Addr(), bound.Port())
		}
	}
	for i, w := range e.workers {
		fd, pending := fds[i], false
		if fd < 0 {
			var err error
			if handed {
				// The predecessor still accepts on the sockets it handed
				// over, until this process starts accepting (its first
				// Apply). A socket made here listens only then: listening
				// now, it would take its share of the connections, which
				// nobody would accept meanwhile (with more workers than
				// the predecessor had).
				fd, err = bindSocket(addr, v6only, e.f.cfg.KeepAlive)
				pending = true
			} else {
				fd, err = listenSocket(addr, v6only, e.f.cfg.KeepAlive)
			}
			if err != nil {
				return fail(err)
			}
			fds[i] = fd
			if addr.Port() == 0 { // the kernel chose it for the first socket
				bound, err := sockName(fd)
				if err != nil {
					return fail(err)
				}
				addr = netip.AddrPortFrom(addr.Addr(), bound.Port())
			}
		}
		ln := &loopListener{w: w, fd: fd, redirect: k.redirect, local: addr, pending: pending}
		ln.retry = timer{idx: -1, kind: timerAccept, ln: ln}
		g.socks = append(g.socks, ln)
	}
	return g, nil
}

func (g *loopListeners) addr() netip.AddrPort { return g.socks[0].local }
func (g *loopListeners) count() int           { return len(g.socks) }

func (g *loopListeners) start() {
	if g.started {
		return
	}
	g.started = true
	for _, ln := range g.socks {
		ln.w.post(func(w *worker) {
			if ln.closed {
				return
			}
			if ln.pending {
				if err := unix.Listen(ln.fd, listenBacklog()); err != nil {
					w.log.Error("cannot listen", zap.Stringer("listener", ln.local), zap.Error(err))
					return
				}
				ln.pending = false
			}
			if err := w.register(ln.fd, fdEntry{ln: ln}, unix.EPOLLIN|unix.EPOLLET); err != nil {
				w.log.Error("cannot accept", zap.Stringer("listener", ln.local), zap.Error(err))
				return
			}
			w.accept(ln) // connections queued before the edge
		})
	}
}

func (g *loopListeners) close(wait bool) {
	var wg sync.WaitGroup
	for _, ln := range g.socks {
		wg.Add(1)
		ln.w.post(func(*worker) { ln.closeNow(); wg.Done() })
	}
	if wait {
		wg.Wait()
	}
}

// closeNow closes ln on its worker's goroutine.
func (ln *loopListener) closeNow() {
	if ln.closed {
		return
	}
	ln.closed = true
	ln.w.timers.stop(&ln.retry)
	ln.w.closeShared(ln.fd)
}

func (g *loopListeners) files() ([]*os.File, error) {
	var out []*os.File
	for _, ln := range g.socks {
		// A socket not listening yet (pending) is not handed over: the
		// successor makes its own.
		fd, err := ln.w.dupOwned(ln.fd, &ln.closed, &ln.pending)
		if err != nil {
			for _, f := range out {
				if f != nil {
					f.Close()
				}
			}
			return nil, err
		}
		var file *os.File
		if fd >= 0 {
			file = os.NewFile(uintptr(fd), "listener")
		}
		out = append(out, file)
	}
	return out, nil
}

// accept takes what ln has queued, acceptBatch at a time.
func (w *worker) accept(ln *loopListener) {
	if ln.paused || ln.closed {
		return
	}
	for range acceptBatch {
		fd, err := accept4(ln.fd, &w.rsa)
		switch {
		case err == nil:
			ln.backoff = 0
			w.open(ln, fd)
			if ln.closed { // a task run by open's hook closed it
				return
			}
			continue
		case err == unix.EAGAIN:
			return
		case err == unix.EINTR:
			continue
		case isFDLimit(err):
			w.f.m.acceptFDLimit.Inc()
			if shedPipes() > 0 { // idle splice pipes hold descriptors: retry with theirs
				continue
			}
			switch err := refuseWithSpare(func() (int, error) { return accept4(ln.fd, &w.rsa) }, w.refusedLog(ln)); err {
			case nil: // one queued client refused: the next may be too
				continue
			case unix.EAGAIN:
				return
			default:
				w.pauseAccept(ln, err)
				return
			}
		default:
			w.f.m.acceptOther.Inc()
			if err != unix.ECONNABORTED {
				w.log.Debug("accept failed", zap.Stringer("listener", ln.local), zap.Error(err))
			}
		}
	}
	if !ln.queued { // more may wait with no new edge: come back before parking
		ln.queued = true
		w.again = append(w.again, ln)
	}
}

// relayRef is a relay as it was when queued: a relay that finished and
// was reused since has another id.
type relayRef struct {
	r  *relay
	id uint64
}

// later queues r to be pumped again before the worker waits.
func (w *worker) later(r *relay) {
	if !r.queued {
		r.queued = true
		w.busy = append(w.busy, relayRef{r, r.id})
	}
}

func (w *worker) pumpBusy() {
	busy := w.busy
	w.busy = nil
	for _, ref := range busy {
		if ref.r.id == ref.id && ref.r.state == relayOpen {
			ref.r.queued = false
			ref.r.pump()
		}
	}
}

func (w *worker) acceptAgain() {
	lns := w.again
	w.again = nil
	for _, ln := range lns {
		ln.queued = false
		w.accept(ln)
	}
}

// refusedLog returns what refuseWithSpare runs for a client accepted only to
// be reset for lack of descriptors.
func (w *worker) refusedLog(ln *loopListener) func(fd int) {
	return func(fd int) {
		dst := ln.local
		if ln.redirect {
			if od, err := getOriginalDst(fd); err == nil {
				dst = od
			}
		}
		w.f.logRefused(rawAddrPort(&w.rsa), dst)
	}
}

// pauseAccept stops accepting on ln for a back-off (5ms doubling to 1s)
// when the process is out of descriptors: open connections keep flowing
// meanwhile, and the kernel keeps the new ones queued.
func (w *worker) pauseAccept(ln *loopListener, err error) {
	ln.backoff = min(max(2*ln.backoff, 5*time.Millisecond), time.Second)
	ln.paused = true
	w.timers.set(&ln.retry, w.now+int64(ln.backoff))
	if w.now-ln.lastLog > int64(10*time.Second) || ln.lastLog == 0 {
		ln.lastLog = w.now
		w.log.Warn("accepting paused for lack of file descriptors; backing off",
			zap.Stringer("listener", ln.local), zap.Duration("backoff", ln.backoff), zap.Error(err))
	}
}

// accept4 accepts a connection from fd as a non-blocking socket, with its
// peer's address in rsa.
func accept4(fd int, rsa *unix.RawSockaddrAny) (int, error) {
	l := uint32(unix.SizeofSockaddrAny)
	nfd, _, e := unix.RawSyscall6(unix.SYS_ACCEPT4, uintptr(fd), uintptr(unsafe.Pointer(rsa)), uintptr(unsafe.Pointer(&l)),
		unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
	if e != 0 {
		return -1, e
	}
	return int(nfd), nil
}
