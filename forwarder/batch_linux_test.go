package forwarder

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/lb"
)

// batchHarness is a one-worker forwarder with io_uring serving svc: one
// worker, so every connection's messages meet in its batches.
func batchHarness(t *testing.T, svc lb.Service) (*harness, string) {
	t.Helper()
	if testEngine == EngineGoroutines || testIOUring == IOUringOff {
		t.Skip("the io_uring batch belongs to the event loop with io_uring on")
	}
	h := newHarness(t, Config{Workers: 1}, svc)
	if testutil.ToFloat64(h.m.IOUringWorkers) != 1 {
		t.Skip("this kernel or sandbox refuses io_uring (the forwarder logged why); the loop's read-and-write path is tested by every other test")
	}
	return h, netip.AddrPortFrom(svc.ClusterIPs[0], svc.Port).String()
}

// echoRounds opens conns connections to fe and, from all of them at once,
// sends rounds messages each and checks every echo byte for byte. Message
// sizes vary from a few bytes to more than a slot (batchSlotSize), so some
// messages finish in the relay's own pump.
func echoRounds(t *testing.T, fe string, conns, rounds int, between func(round int)) {
	t.Helper()
	cs := make([]net.Conn, conns)
	for i := range cs {
		c, err := net.DialTimeout("tcp", fe, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cs[i] = c
	}
	for round := range rounds {
		if between != nil {
			between(round)
		}
		var wg sync.WaitGroup
		errs := make(chan error, conns)
		for i, c := range cs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				size := 1 + (i*131+round*17)%2000
				if (i+round)%9 == 0 {
					size = batchSlotSize + 5000
				}
				msg := bytes.Repeat([]byte{byte(i), byte(round), byte(size)}, size/3+1)[:size]
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				go func() { _, _ = c.Write(msg) }()
				got := make([]byte, size)
				if _, err := io.ReadFull(c, got); err != nil {
					errs <- fmt.Errorf("connection %d, round %d: reading the echo of %d bytes: %w", i, round, size, err)
					return
				}
				if !bytes.Equal(got, msg) {
					errs <- fmt.Errorf("connection %d, round %d: the echo of %d bytes differs", i, round, size)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
}

// TestBatchManyConnections: more connections than a round has slots send
// at once through one worker; every byte comes back in order, and the
// messages went through the io_uring batches.
func TestBatchManyConnections(t *testing.T) {
	h, fe := batchHarness(t, service("echo", freeFrontend(t), startBackend(t, "echo", modeEcho).addr))
	echoRounds(t, fe, batchSlots+batchSlots/2, 20, nil)
	if got := testutil.ToFloat64(h.m.IOUringMessages); got == 0 {
		t.Error("no message went through io_uring")
	}
}

// TestBatchRingFails: the ring breaks between a round's reads and its
// writes (its descriptor is closed under it). The bytes already read are
// held and written by the relays' own pumps, and the worker goes on with a
// read and a write per message: no byte is lost or reordered.
func TestBatchRingFails(t *testing.T) {
	h, fe := batchHarness(t, service("echo", freeFrontend(t), startBackend(t, "echo", modeEcho).addr))
	var broke atomic.Bool
	hook := func(u *uring) {
		if broke.CompareAndSwap(false, true) {
			unix.Close(u.fd)
			u.fd = -1
		}
	}
	t.Cleanup(func() { testHookBatchWrites.Store(nil) })
	echoRounds(t, fe, 40, 12, func(round int) {
		if round == 4 {
			testHookBatchWrites.Store(&hook)
		}
	})
	if !broke.Load() {
		t.Fatal("no round reached the hook")
	}
	if got := testutil.ToFloat64(h.m.IOUringWorkers); got != 0 {
		t.Errorf("io_uring_workers = %v after the ring failed, want 0", got)
	}
}

// TestBatchBackPressure: the client sends small messages, one at a time,
// to a backend that reads nothing for a while; its socket and the
// forwarder's fill, so one of the forwarder's batched writes comes back
// short or would block. What it did not take is held and written, in
// order, once the backend reads.
func TestBatchBackPressure(t *testing.T) {
	// A small receive buffer, set before the handshake so that the
	// window starts small too: the backend's side fills sooner.
	lc := net.ListenConfig{Control: func(_, _ string, raw syscall.RawConn) error {
		var err error
		_ = raw.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 32<<10) })
		return err
	}}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := l.(*net.TCPListener)
	defer ln.Close()
	const msg = 2000
	const total = 1536 * msg
	stalled := make(chan struct{})
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.AcceptTCP()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		<-stalled
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, _ := io.ReadAll(io.LimitReader(c, total))
		got <- b
	}()
	h, fe := batchHarness(t, service("slow", freeFrontend(t), ln.Addr().(*net.TCPAddr).AddrPort()))
	c, err := net.DialTimeout("tcp", fe, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The forwarder's socket to the backend gets the smallest send buffer,
	// so its writes block long before the client has sent everything.
	waitFor(t, "the connection to be open, its send buffer shrunk", func() bool {
		shrunk := false
		for _, w := range h.fwd.tcp.(*loopEngine).workers {
			done := make(chan struct{})
			w.post(func(w *worker) {
				defer close(done)
				for _, r := range w.relays {
					if r.state == relayOpen {
						shrunk = unix.SetsockoptInt(r.up.fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<10) == nil
					}
				}
			})
			<-done
		}
		return shrunk
	})
	want := make([]byte, total)
	for i := range want {
		want[i] = byte(i / msg)
	}
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		// One message at a time, so the forwarder reads each alone and
		// writes it in a batch, until the backend's side is full.
		for off := 0; off < total; off += msg {
			if _, err := c.Write(want[off : off+msg]); err != nil {
				return
			}
			time.Sleep(100 * time.Microsecond)
		}
	}()
	select {
	case <-sent:
	case <-time.After(10 * time.Second):
		t.Fatal("the client could not send")
	}
	time.Sleep(100 * time.Millisecond) // for the forwarder to take the last
	close(stalled)
	b := <-got
	if !bytes.Equal(b, want) {
		t.Fatalf("the backend got %d bytes, not the %d sent, in order", len(b), total)
	}
	if testutil.ToFloat64(h.m.IOUringMessages) == 0 {
		t.Error("no message went through io_uring")
	}
}

// TestBatchNoWriteAfterRelayEnds: in one round, a relay's client half reads
// a message and its backend half reads a reset, which ends the relay and
// closes both its sockets before the round's writes. The message is not
// written by the old socket's number: here another socket is given that
// number in between (as another thread's accept could), and nothing may
// arrive on it.
func TestBatchNoWriteAfterRelayEnds(t *testing.T) {
	ln := loopbackListener(t)
	h, fe := batchHarness(t, service("resetter", freeFrontend(t), ln.Addr().(*net.TCPAddr).AddrPort()))
	w := h.fwd.tcp.(*loopEngine).workers[0]
	// One message across, so the relay is open and both halves batchable.
	c, bc := openThrough(t, netip.MustParseAddrPort(fe), ln)
	up := make(chan int, 1)
	w.post(func(w *worker) { up <- w.relays[0].up.fd })
	upFD := <-up

	// Hold the worker while the client's message and the backend's reset
	// arrive, so that one harvest, one round, takes both.
	release := stallWorkers(t, h)
	if _, err := io.WriteString(c, "for a relay that ends"); err != nil {
		t.Fatal(err)
	}
	_ = bc.SetLinger(0)
	bc.Close()
	time.Sleep(20 * time.Millisecond)

	pair := [2]int{-1, -1}
	var ended bool
	hook := func(*uring) {
		testHookBatchWrites.Store(nil)
		if _, err := unix.FcntlInt(uintptr(upFD), unix.F_GETFD, 0); err != unix.EBADF {
			return // the relay did not end in the reads: nothing to test
		}
		ended = true
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return
		}
		// One end to a number clear of the relay's, the other to the
		// relay's backend socket's (socketpair may have taken either).
		peer, err := unix.FcntlInt(uintptr(fds[1]), unix.F_DUPFD_CLOEXEC, 1000)
		unix.Close(fds[1])
		if err != nil {
			unix.Close(fds[0])
			return
		}
		if fds[0] != upFD {
			_ = unix.Dup3(fds[0], upFD, unix.O_CLOEXEC)
			unix.Close(fds[0])
		}
		pair = [2]int{upFD, peer}
	}
	testHookBatchWrites.Store(&hook)
	t.Cleanup(func() { testHookBatchWrites.Store(nil) })
	release()

	if _, err := io.ReadAll(c); err == nil {
		t.Fatal("the client's connection ended cleanly; want the backend's reset passed on")
	}
	done := make(chan struct{})
	w.post(func(*worker) { close(done) }) // the round is over
	<-done
	if !ended {
		t.Fatal("the round's reads did not end the relay (the reset and the message came in different rounds)")
	}
	if pair[1] < 0 {
		t.Fatal("no socket could take the ended relay's number")
	}
	defer unix.Close(pair[0])
	defer unix.Close(pair[1])
	buf := make([]byte, 64)
	if n, _, err := unix.Recvfrom(pair[1], buf, unix.MSG_DONTWAIT); err != unix.EAGAIN {
		t.Fatalf("the ended relay's message was written to the socket that took its number: %q, %v", buf[:max(n, 0)], err)
	}
}
