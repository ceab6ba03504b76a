package forwarder

import (
	"sync/atomic"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// A worker with an io_uring (Config.IOUring) does not pump a relay when
// epoll reports its socket: it notes the relay, and after the harvest
// moves the small messages of every noted relay in two system calls, one
// io_uring_enter for all the reads and one for all the writes, instead of
// a read and a write per message. Everything that is not a small message
// in flight between two idle halves (bytes held back, a splice, an end, a
// bulk stream, an offloaded connection) is left to the relay's own pump,
// which also runs after the batch to finish what the batch began (a
// source still readable after a full slot, an EOF to pass on, the
// first-byte check).

const (
	batchSlots    = 64       // message slots: halves read in one round
	batchSlotSize = 16 << 10 // a slot filled whole leaves the rest to the pump
)

// testHookBatchWrites, if set, runs between a round's reads and its
// writes.
var testHookBatchWrites atomic.Pointer[func(*uring)]

// batch is a worker's batched relay I/O.
type batch struct {
	u     *uring
	slots []byte
	noted []relayRef // relays with events since the last round
	ops   [batchSlots]batchOp
	nops  int
	sent  int        // writes queued in this round: messages moved
	round []relayRef // relays with an operation in this round
}

// batchOp is one half's message through a slot.
type batchOp struct {
	r        *relay
	h        *half
	src, dst *side
	n        int  // bytes read into the slot
	ran      bool // its operation completed
	write    bool // its read took bytes to write (batchWrites queues them)
}

func newBatch() (*batch, error) {
	u, err := newUring(2 * batchSlots)
	if err != nil {
		return nil, err
	}
	return &batch{u: u, slots: make([]byte, batchSlots*batchSlotSize)}, nil
}

func (b *batch) close() { b.u.close() }

func (b *batch) slot(i int) []byte {
	return b.slots[i*batchSlotSize : (i+1)*batchSlotSize]
}

// note defers r's pump to the end of the harvest.
func (w *worker) note(r *relay) {
	if !r.noted {
		r.noted = true
		w.batch.noted = append(w.batch.noted, relayRef{r, r.id})
	}
}

// batchable reports whether h is a half whose next bytes can go through a
// slot: it holds nothing back, has not ended and is not a bulk stream.
func (h *half) batchable() bool {
	return h.p == nil && h.buf == nil && !h.eof && !h.done && !h.splicing
}

// runBatch moves the noted relays' messages, a round of up to batchSlots
// halves at a time.
func (w *worker) runBatch() {
	b := w.batch
	noted := b.noted
	for i := 0; i < len(noted) && w.batch != nil; i++ {
		ref := noted[i]
		r := ref.r
		if r.id != ref.id || r.state != relayOpen {
			continue
		}
		r.noted = false
		if r.offOn || !r.in.batchable() || !r.out.batchable() {
			r.pump()
			continue
		}
		in := r.client.readable && r.in.turn < turnBudget
		out := r.up.readable && r.out.turn < turnBudget
		if !in && !out {
			r.pump() // an EPOLLOUT with nothing held, the first-byte check
			continue
		}
		if b.nops+2 > batchSlots {
			w.batchRound()
			if w.batch == nil { // the ring failed: the rest is pumped below
				r.noted = true
				break
			}
		}
		if in {
			b.add(r, &r.in, &r.client, &r.up)
		}
		if out {
			b.add(r, &r.out, &r.up, &r.client)
		}
		b.round = append(b.round, ref)
	}
	if w.batch != nil {
		w.batchRound()
	}
	if w.batch == nil { // the ring failed part way: the rest is pumped
		for _, ref := range noted {
			if ref.r.id == ref.id && ref.r.noted && ref.r.state == relayOpen {
				ref.r.noted = false
				ref.r.pump()
			}
		}
		return
	}
	clear(noted)
	w.batch.noted = noted[:0]
}

func (b *batch) add(r *relay, h *half, src, dst *side) {
	b.ops[b.nops] = batchOp{r: r, h: h, src: src, dst: dst}
	b.u.queue(uringOpRecv, src.fd, b.slot(b.nops), uint64(b.nops))
	b.nops++
}

// batchRound submits the queued reads, then the writes of what they read,
// then pumps every relay of the round.
func (w *worker) batchRound() {
	b := w.batch
	err := b.u.submit(w.batchRead)
	if err == nil {
		w.batchWrites()
		if hook := testHookBatchWrites.Load(); hook != nil {
			(*hook)(b.u)
		}
		err = b.u.submit(w.batchWritten)
	}
	if err != nil {
		w.batchFailed(err)
	}
	w.f.m.IOUringMessages.Add(float64(b.sent))
	for i := range b.nops {
		b.ops[i] = batchOp{}
	}
	b.nops, b.sent = 0, 0
	for _, ref := range b.round {
		if ref.r.id == ref.id && ref.r.state == relayOpen {
			ref.r.pump()
		}
	}
	clear(b.round)
	b.round = b.round[:0]
}

// batchRead takes a read's result as readIn would, and notes the write of
// what it read for batchWrites.
func (w *worker) batchRead(tag uint64, res int32) {
	b := w.batch
	op := &b.ops[tag]
	op.ran = true
	r, h, src := op.r, op.h, op.src
	if r.state != relayOpen {
		return // the other half's error ended it
	}
	switch {
	case res == -int32(unix.EAGAIN):
		src.readable = false
		return
	case res == -int32(unix.EINTR):
		return // the pump reads again
	case res < 0:
		r.fail(h, unix.Errno(-res))
		return
	case res == 0:
		h.eof = true
		r.passEOF(h, op.dst) // h holds nothing: batchable
		return
	}
	n := int(res)
	if r.took(h, src, n, batchSlotSize) && h.eof {
		// The last bytes go now, and the FIN right after them, as readIn
		// and flow would do: batched, they would leave with the round's
		// other writes and the FIN after the round, and a peer that reads
		// them and closes in between would close first (with a connection
		// per request, the client would collect the TIME_WAITs, and its
		// connects slow down as its ports fill).
		if sent, _ := r.send(h, op.dst, b.slot(int(tag))[:n]); sent {
			r.passEOF(h, op.dst)
		}
		return
	}
	op.n = n
	op.ran = false
	op.write = true
}

// batchWrites queues the writes of what the round's reads took, once every
// read's result is in, for the relays still open. A relay whose second
// half's read failed was finished after its first half's read, and its
// descriptors closed: a write queued by number then would go to whatever
// socket or pipe another thread has opened under that number since.
func (w *worker) batchWrites() {
	b := w.batch
	for i := range b.nops {
		op := &b.ops[i]
		if !op.write {
			continue
		}
		op.write = false
		if op.r.state != relayOpen {
			op.ran = true // nothing to write, and nothing to hold
			continue
		}
		b.sent++
		b.u.queue(uringOpSend, op.dst.fd, b.slot(i)[:op.n], uint64(i))
	}
}

// batchWritten takes a write's result as readIn would: what the socket
// did not take waits in a borrowed buffer.
func (w *worker) batchWritten(tag uint64, res int32) {
	op := &w.batch.ops[tag]
	op.ran = true
	r, h := op.r, op.h
	if r.state != relayOpen {
		return
	}
	m := 0
	switch {
	case res >= 0:
		m = int(res)
	case res == -int32(unix.EAGAIN) || res == -int32(unix.EINTR):
	default:
		r.fail(h, unix.Errno(-res))
		return
	}
	h.bytes += int64(m)
	if m < op.n {
		op.dst.writable = false
		r.hold(h, w.batch.slot(int(tag))[m:op.n])
	}
}

// batchFailed gives the ring up: a write whose read ran but which did not
// run itself is held for the pump to write, and the worker goes on with
// a system call per message.
func (w *worker) batchFailed(err error) {
	b := w.batch
	w.log.Warn("io_uring failed; moving messages with read and write from now on", zap.Error(err))
	for i := range b.nops {
		op := &b.ops[i]
		if !op.ran && op.n > 0 && op.r.state == relayOpen {
			op.r.hold(op.h, b.slot(i)[:op.n])
		}
	}
	b.close()
	// An operation that did not complete before the ring was closed is
	// cancelled by the kernel in its own time: its slot stays allocated
	// for as long as the worker lives, never reused.
	w.retired = b.slots
	w.batch = nil
	w.f.m.IOUringWorkers.Dec()
}
