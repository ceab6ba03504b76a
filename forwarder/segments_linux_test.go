package forwarder

import (
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The segments a connection costs: where the proxy knows what comes next,
// it lets the kernel put a FIN or an ACK in the segment of the bytes it
// goes with. The receiving end counts what it got with TCP_INFO.

// tcpInfo reads c's TCP_INFO.
func tcpInfo(c *net.TCPConn) (*unix.TCPInfo, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var info *unix.TCPInfo
	if cerr := rc.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); cerr != nil {
		return nil, cerr
	}
	if err != nil {
		return nil, fmt.Errorf("reading TCP_INFO: %w", err)
	}
	return info, nil
}

// segmentsIn reports how many segments c received, and how many of them
// carried bytes.
func segmentsIn(c *net.TCPConn) (segs, data uint32, err error) {
	info, err := tcpInfo(c)
	if err != nil {
		return 0, 0, err
	}
	return info.Segs_in, info.Data_segs_in, nil
}

// lastWrite sends msg and then the FIN, both in one segment.
func lastWrite(c *net.TCPConn, msg string) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var werr error
	if err := rc.Write(func(fd uintptr) bool {
		_, werr = unix.SendmsgN(int(fd), []byte(msg), nil, nil, unix.MSG_MORE)
		return werr != unix.EAGAIN
	}); err != nil {
		return err
	}
	if werr != nil {
		return werr
	}
	return c.CloseWrite()
}

// stallWorkers holds every event loop of h until release is called: what
// arrives meanwhile waits in the kernel.
func stallWorkers(t *testing.T, h *harness) (release func()) {
	t.Helper()
	free := make(chan struct{})
	for _, w := range h.fwd.tcp.(*loopEngine).workers {
		held := make(chan struct{})
		w.post(func(*worker) { close(held); <-free })
		<-held
	}
	return func() { close(free) }
}

// TestFINLeavesWithLastBytes: when a source's FIN comes with its last
// bytes, the proxy sends those bytes and the FIN in one segment, in both
// directions. The peers here send theirs that way too (MSG_MORE, then
// shutdown), so the proxy sees bytes and FIN at once; the client's reach
// the proxy before it accepts (its workers are held), so they also carry
// the handshake's last ACK to the backend.
func TestFINLeavesWithLastBytes(t *testing.T) {
	if testEngine == EngineGoroutines {
		t.Skip("the goroutine engine passes a FIN by CloseWrite after its copy: it cannot know the FIN came with the last bytes")
	}
	const msg = "the last words of a connection\n"
	cases := []struct {
		name string
		// clientLast: the client sends msg and its FIN and the backend
		// counts; otherwise the backend does and the client counts.
		clientLast bool
		// segments the receiver gets: the client SYN-ACK, then bytes
		// with FIN; the backend SYN, then the handshake's ACK with bytes
		// and FIN. A FIN of its own makes one more.
		want uint32
	}{
		{name: "backend's reply and FIN reach the client in one segment", want: 2},
		{name: "client's request and FIN reach the backend in one segment, with the handshake's ACK", clientLast: true, want: 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			leakCheck(t)
			ln, fe, h := proxiedBackend(t, "last-words")
			type result struct {
				got        string
				segs, data uint32
				err        error
			}
			backend := make(chan result, 1)
			go func() {
				c, err := ln.AcceptTCP()
				if err != nil {
					backend <- result{err: err}
					return
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if !tc.clientLast {
					backend <- result{err: lastWrite(c, msg)}
					_, _ = io.Copy(io.Discard, c)
					return
				}
				got, err := io.ReadAll(c)
				res := result{got: string(got), err: err}
				if err == nil {
					res.segs, res.data, res.err = segmentsIn(c)
				}
				backend <- res
			}()
			var release func()
			if tc.clientLast {
				release = stallWorkers(t, h)
			}
			c := dial(t, fe)
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			var res result
			if tc.clientLast {
				err := lastWrite(c, msg)
				release()
				if err != nil {
					t.Fatalf("client sending: %v", err)
				}
				res = <-backend
			} else {
				got, err := io.ReadAll(c)
				res = result{got: string(got), err: err}
				if err == nil {
					res.segs, res.data, res.err = segmentsIn(c)
				}
				if berr := (<-backend).err; berr != nil {
					t.Fatalf("backend sending: %v", berr)
				}
			}
			if res.err != nil || res.got != msg {
				t.Fatalf("received %q, %v; want %q then EOF", res.got, res.err, msg)
			}
			if res.data != 1 || res.segs != tc.want {
				t.Errorf("receiver got %d segments, %d with data; want %d, 1 with data", res.segs, res.data, tc.want)
			}
		})
	}
}

// TestFirstBytesCarryHandshakeACK: a client whose first bytes are there
// when the proxy accepts it has them reach the backend in the segment that
// completes the handshake (SYN, then ACK with bytes: two segments, not
// three). A client that waits for the server to speak first costs the
// backend no wait: its handshake completes at once, not after the
// kernel's 200 ms delayed-ACK bound.
func TestFirstBytesCarryHandshakeACK(t *testing.T) {
	if testEngine == EngineGoroutines {
		t.Skip("the goroutine engine dials before it reads the client")
	}
	leakCheck(t)
	ln, fe, h := proxiedBackend(t, "first-words")

	t.Run("client speaks first", func(t *testing.T) {
		const req = "the client's first words\n"
		release := stallWorkers(t, h)
		c := dial(t, fe) // the kernel completes the handshake; the proxy has not accepted
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, werr := io.WriteString(c, req)
		release()
		if werr != nil {
			t.Fatal(werr)
		}
		_ = ln.SetDeadline(time.Now().Add(5 * time.Second))
		b, err := ln.AcceptTCP()
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		_ = b.SetDeadline(time.Now().Add(5 * time.Second))
		got := make([]byte, len(req))
		if _, err := io.ReadFull(b, got); err != nil || string(got) != req {
			t.Fatalf("backend read %q, %v; want %q", got, err, req)
		}
		segs, data, err := segmentsIn(b)
		if err != nil {
			t.Fatal(err)
		}
		if segs != 2 || data != 1 {
			t.Errorf("backend got %d segments, %d with data, up to the request; want 2, 1 with data (SYN, then the ACK with the bytes)", segs, data)
		}
		if _, err := io.WriteString(b, "answer\n"); err != nil {
			t.Fatal(err)
		}
		if line, err := readLine(c); err != nil || line != "answer\n" {
			t.Fatalf("client read %q, %v", line, err)
		}
	})

	t.Run("server speaks first", func(t *testing.T) {
		// A held ACK delays every connection's accept by the kernel's
		// 200 ms bound; one that is not takes microseconds. Three tries
		// so that a slow machine does not fail the test.
		var took []time.Duration
		for range 3 {
			start := time.Now()
			c := dial(t, fe)
			_ = ln.SetDeadline(time.Now().Add(5 * time.Second))
			b, err := ln.AcceptTCP()
			if err != nil {
				c.Close()
				t.Fatal(err)
			}
			took = append(took, time.Since(start))
			_, _ = io.WriteString(b, "greeting\n")
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			line, err := readLine(c)
			b.Close()
			c.Close()
			if err != nil || line != "greeting\n" {
				t.Fatalf("client read %q, %v; want the greeting", line, err)
			}
			if took[len(took)-1] < 150*time.Millisecond {
				return
			}
		}
		t.Errorf("the backend accepted %v after the client dialled: its handshake waited for bytes the client never sent", took)
	})
}

// readLine reads up to and including a newline, a byte at a time (nothing
// read past it).
func readLine(c net.Conn) (string, error) {
	var line []byte
	b := make([]byte, 1)
	for {
		if _, err := c.Read(b); err != nil {
			return string(line), err
		}
		line = append(line, b[0])
		if b[0] == '\n' {
			return string(line), nil
		}
	}
}

// TestDrainedSourceAckedAtOnce: bytes the proxy spliced from a backend
// are acknowledged as soon as it has drained the backend's socket, not
// when the kernel's delayed-ACK timer fires (20–40 ms later): a sender
// waiting on that ACK, as at the end of every response, would stall for
// as long. Under load the kernel holds such ACKs back whenever the proxy
// reads later than bytes arrive; here the proxy's backend socket is put in
// delayed-ACK mode (TCP_QUICKACK off) to hold them back every time.
func TestDrainedSourceAckedAtOnce(t *testing.T) {
	if testEngine == EngineGoroutines {
		t.Skip("the goroutine engine's splice is Go's own")
	}
	leakCheck(t)
	ln, fe, h := proxiedBackend(t, "bulk")
	// delayACKs puts the backend socket of every open relay in delayed-ACK
	// mode, and reports whether the relay splices what the backend sends.
	delayACKs := func() bool {
		var splicing atomic.Bool
		h.fwd.tcp.(*loopEngine).each(func(w *worker) {
			for _, r := range w.relays {
				if r.state == relayOpen {
					splicing.Store(r.out.splicing)
					_ = unix.SetsockoptInt(r.up.fd, unix.IPPROTO_TCP, unix.TCP_QUICKACK, 0)
				}
			}
		})
		return splicing.Load()
	}
	// Three connections, two of which must be acknowledged within 10 ms
	// (microseconds, unless the machine is very busy); the timer takes
	// 20–40 ms.
	var waits []time.Duration
	for range 3 {
		c := dial(t, fe)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_ = ln.SetDeadline(time.Now().Add(5 * time.Second))
		b, err := ln.AcceptTCP()
		if err != nil {
			t.Fatal(err)
		}
		_ = b.SetDeadline(time.Now().Add(10 * time.Second))
		// A bulk start: the proxy splices from here on.
		const bulk = 1 << 20
		go func() { _, _ = b.Write(make([]byte, bulk)) }()
		if _, err := io.CopyN(io.Discard, c, bulk); err != nil {
			t.Fatalf("client reading: %v", err)
		}
		if !delayACKs() {
			t.Fatal("the relay does not splice after 1 MiB from the backend")
		}
		// The end of a response, spliced, then nothing.
		if _, err := b.Write(make([]byte, 1000)); err != nil {
			t.Fatal(err)
		}
		if _, err := io.CopyN(io.Discard, c, 1000); err != nil {
			t.Fatalf("client reading: %v", err)
		}
		got := time.Now()
		for {
			info, err := tcpInfo(b)
			if err != nil {
				t.Fatal(err)
			}
			n := info.Unacked
			if n == 0 {
				break
			}
			if time.Since(got) > 2*time.Second {
				t.Fatalf("backend still has %d segments unacknowledged 2 s after the client read everything", n)
			}
			time.Sleep(100 * time.Microsecond)
		}
		waits = append(waits, time.Since(got))
		b.Close()
		c.Close()
		h.settle() // the next connection's relay is the only open one
	}
	fast := 0
	for _, w := range waits {
		if w < 10*time.Millisecond {
			fast++
		}
	}
	t.Logf("acknowledged %v after the client read the last byte", waits)
	if fast < 2 {
		t.Errorf("the backend's last bytes were acknowledged %v after the client read them: the delayed-ACK timer's wait, not the drain's", waits)
	}
}
