package forwarder

import (
	"time"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/offload"
)

// Offloaded relays
//
// With Config.Offload = OffloadSockmap, a relay whose backend connected
// offloadAfter ago or more and whose halves hold no bytes (what the client
// sent while the backend was dialled is written first) puts its two
// sockets into the offloader the next time it moves bytes: from
// then on the kernel sends what each receives out of the other, and the
// relay sees no events for data. It stays in its worker as before and
// still reacts to what reaches it:
//
//   - A FIN arrives as EPOLLRDHUP and a read of 0, as ever. The bytes the
//     kernel took from that socket may still be on their way out of the
//     peer (the verdict queues them to the peer's psock, sent by a
//     kworker), and a shutdown now would end the peer's stream before
//     them: the half waits until the peer's socket has had as many bytes
//     written into it (TCP_INFO acked + SIOCOUTQ) as the program counted,
//     polling after offloadPoll, then twice as long each time up to
//     offloadPollMax, and gives up after offloadStall with no progress.
//   - A reset or error arrives as ever and resets both sides.
//   - Bytes user space does read (the offloader left a socket, or a fake
//     that moves nothing) are relayed as without offload.
//   - Idle: the idle timer reads the program's counters; a change is
//     activity. Drain and shutdown close the sockets as ever.
//   - The connection log's byte counts are the relay's own plus the
//     program's counters, read when the relay finishes.
//
// A failed insertion (map full, a socket the kernel will not take) leaves
// the relay on the user-space path and is counted.
//
// Why not at once: a connection per request gains nothing from the kernel
// path (the insertion and removal cost more map updates than its few
// messages save), and loses the order of its end. Offloaded, the backend's
// response reaches the client from the kernel at once while its FIN waits
// for the worker to see EPOLLRDHUP; a client that reads the response and
// closes in between closes first and collects the TIME_WAIT. Measured
// (2026-11-27, wrk, 64 connections each sending one request, the churn
// rig): offloaded at once, the client held 14,000 TIME_WAITs after 6 s,
// its connects slowed as they filled its ports, and the rate fell from
// 4.4k to 700–890 connections/s; the bench's svcproxy-sockmap row showed
// it in every full run (566–878/s in round 1, after the profile's churn).
// A connection older than offloadAfter is one that carries more than a
// request: it is offloaded at its next bytes.

// offloadAfter is how long a relay is open before it may be offloaded
// (see above); a variable for tests.
var offloadAfter = 100 * time.Millisecond

const (
	offloadPoll    = 100 * time.Microsecond // a half waiting for the kernel's bytes looks again after this, doubling
	offloadPollMax = 5 * time.Millisecond   // up to this
	offloadStall   = 2 * time.Second        // a wait with no progress this long ends: the FIN goes anyway
)

// startOffload sets up the engine's offloader: Config.Offloader, or a
// Sockmap loaded now. When the kernel refuses one, the reason is logged and
// the engine runs without.
func (e *loopEngine) startOffload() {
	f := e.f
	if f.cfg.Offloader != nil {
		e.off = f.cfg.Offloader
		return
	}
	start := time.Now()
	s, err := offload.New(offload.Config{MaxPairs: int(min(max(f.cfg.MaxConns, 0), 1<<20))}) // 0: its default
	if err != nil {
		f.log.Warn("sockmap offload unavailable; every byte goes through user space", zap.Error(err))
		return
	}
	e.off, e.ownOff = s, s
	f.log.Info("sockmap offload on", zap.Duration("took", time.Since(start)))
}

// maybeOffload inserts an open relay's sockets into the offloader once it
// may: it is offloadAfter old, the halves hold nothing, neither has ended,
// and a Service with a first-byte timeout has had its answer (the loop
// must see it). pump calls it until offDone.
func (r *relay) maybeOffload() {
	if r.in.eof || r.out.eof || r.in.done || r.out.done {
		r.offDone = true // half-closed already: little left to move
		return
	}
	if r.w.now-r.opened < int64(offloadAfter) {
		return // young: looked at again when it next moves bytes
	}
	if r.pool.Service.FirstByteTimeout > 0 && !r.answered {
		return
	}
	if !r.in.empty() || !r.out.empty() {
		return // when the sink has taken them
	}
	r.offDone = true
	w, f := r.w, r.w.f
	bi, err := offload.Written(r.up.fd)
	if err == nil {
		var bo uint64
		if bo, err = offload.Written(r.client.fd); err == nil {
			r.offBase = [2]uint64{bi, bo}
			r.offUser = [2]int64{r.in.bytes, r.out.bytes}
			r.off, err = w.e.off.Insert(r.client.fd, r.up.fd)
		}
	}
	if err != nil {
		f.m.offloadFailed.Inc()
		w.log.Debug("cannot offload a connection; it stays in user space", zap.Stringer("backend", r.backend.Addr), zap.Error(err))
		return
	}
	r.offOn = true
	f.m.offloadOK.Inc()
}

// offloadFlushed reports whether the bytes the kernel took from h's source
// are all written into dst, so its FIN may follow. When not, it arms the
// relay's offload timer to look again.
func (r *relay) offloadFlushed(h *half, dst *side) bool {
	c, err := r.w.e.off.Bytes(r.off)
	if err != nil {
		return true // nothing known to wait for
	}
	i, moved := 0, c.In
	if h == &r.out {
		i, moved = 1, c.Out
	}
	target := r.offBase[i] + uint64(h.bytes-r.offUser[i]) + moved
	written, err := offload.Written(dst.fd)
	if err != nil || written >= target {
		r.offWait, r.offPolls = 0, 0
		return true
	}
	now := r.w.now
	switch {
	case r.offWait == 0 || written != r.offProg:
		r.offWait, r.offProg = now, written
	case now-r.offWait > int64(offloadStall):
		r.w.log.Debug("offloaded bytes stopped short of the peer; passing the FIN on",
			zap.Uint64("written", written), zap.Uint64("want", target))
		r.offWait, r.offPolls = 0, 0
		return true
	}
	wait := min(offloadPoll<<r.offPolls, offloadPollMax)
	if wait < offloadPollMax {
		r.offPolls++
	}
	r.w.timers.set(&r.offT, now+int64(wait))
	return false
}

// offloadCheck runs when an offloaded half waiting for its FIN looks again.
func (r *relay) offloadCheck() {
	if r.state == relayOpen {
		r.pump()
	}
}

// offloadActive reports whether the kernel moved bytes for r since it
// last looked.
func (r *relay) offloadActive() bool {
	c, err := r.w.e.off.Bytes(r.off)
	if err != nil {
		return false
	}
	if s := c.In + c.Out; s != r.offSeen {
		r.offSeen = s
		return true
	}
	return false
}

// offloadEnd takes a finishing relay out of the offloader and adds what
// the kernel moved to its counts.
func (r *relay) offloadEnd() {
	off := r.w.e.off
	if c, err := off.Bytes(r.off); err == nil {
		r.in.bytes += int64(c.In)
		r.out.bytes += int64(c.Out)
	} else {
		r.w.log.Debug("cannot read an offloaded connection's byte counts", zap.Error(err))
	}
	off.Remove(r.off)
	r.offOn = false
}
