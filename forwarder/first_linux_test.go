package forwarder

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/lb"
)

// acceptWith returns the proxy's end of a connection whose client has
// already written msg (and, with fin, shut its writes) by the time the
// worker is given it: what a client that speaks at once looks like when
// the worker gets round to it. The client's end is closed with t.
func acceptWith(t *testing.T, msg string, fin bool) (fd int, client *net.TCPConn) {
	t.Helper()
	lfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(lfd)
	if err := unix.Bind(lfd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(lfd, 1); err != nil {
		t.Fatal(err)
	}
	sa, _ := unix.Getsockname(lfd)
	client = dial(t, netip.AddrPortFrom(loopback4, uint16(sa.(*unix.SockaddrInet4).Port)))
	t.Cleanup(func() { client.Close() })
	if _, err := client.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	if fin {
		if err := client.CloseWrite(); err != nil {
			t.Fatal(err)
		}
	}
	fd, _, err = unix.Accept4(lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	return fd, client
}

// handTo gives fd, a connection to fe, to the forwarder's first worker as
// if that worker had accepted it.
func handTo(t *testing.T, h *harness, fd int, fe netip.AddrPort) {
	t.Helper()
	w := h.fwd.tcp.(*loopEngine).workers[0]
	h.fwd.handlers.Add(1)
	a := adoption{fd: fd, id: h.fwd.nextID.Add(1), start: time.Now(), client: netip.AddrPortFrom(loopback4, 1), dst: fe}
	if !w.adopt(a) {
		t.Fatal("the worker took no connection")
	}
}

// TestFirstBytesWhileDialling: what a client sent before its connection
// was served waits (in its socket) through a refused or timed-out attempt
// and reaches the backend that answers; a FIN that came with it is a
// half-close, not a client that left, so the dial goes on and the reply
// comes back.
func TestFirstBytesWhileDialling(t *testing.T) {
	if testEngine == EngineGoroutines {
		t.Skip("hands connections to a worker of the event loop")
	}
	for _, tc := range []struct {
		name     string
		dead     func(testing.TB) netip.AddrPort // a backend beside the echo one, or nil
		timeouts []time.Duration
		fin      bool
		big      bool // more than one read takes
	}{
		{"bytes", nil, nil, false, false},
		{"bytes then FIN", nil, nil, true, false},
		{"bytes beyond a read, then FIN", nil, nil, true, true},
		{"bytes then FIN, a refusing backend beside", refusingAddr, nil, true, false},
		{"bytes then FIN, a backend that drops SYNs beside", blackholeAddr, []time.Duration{100 * time.Millisecond, 5 * time.Second}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leakCheck(t)
			fe := freeFrontend(t)
			be := startBackend(t, "echo", modeEcho)
			addrs := []netip.AddrPort{be.addr}
			if tc.dead != nil {
				addrs = append(addrs, tc.dead(t))
			}
			h := newHarness(t, Config{Workers: 1, DialTimeouts: tc.timeouts}, service("first", fe, addrs...))
			// Enough connections that the dead backend is tried first
			// at least once, whichever the picker starts with.
			for i := range 3 {
				msg := "hello " + string(rune('a'+i))
				if tc.big {
					msg = string(make([]byte, 3*bufferSize+7))
				}
				fd, c := acceptWith(t, msg, tc.fin)
				handTo(t, h, fd, fe)
				if !tc.fin {
					buf := make([]byte, len(msg))
					_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
					if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
						t.Fatalf("connection %d: the echo of %d bytes: %d bytes, %v", i, len(msg), len(buf), err)
					}
					continue
				}
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				got, err := io.ReadAll(c)
				if err != nil || string(got) != msg {
					t.Fatalf("connection %d: the echo of %d bytes and the backend's FIN: %d bytes, %v", i, len(msg), len(got), err)
				}
			}
			if n := testutil.ToFloat64(h.m.connClientGone); n != 0 {
				t.Errorf("%v connections counted as clients that left, want 0", n)
			}
			if tc.dead != nil && testutil.ToFloat64(h.m.dialRefused)+testutil.ToFloat64(h.m.dialTimeout) == 0 {
				t.Error("no connection tried the dead backend first")
			}
		})
	}
}

// TestFirstByteAnswerWithEnd: for a Service with a first-byte timeout the
// backend's answer is its success (passive health), also when the answer
// and the backend's FIN come in the same harvest as the client's FIN, so
// that the relay finishes in the pump that reads them.
func TestFirstByteAnswerWithEnd(t *testing.T) {
	if testEngine == EngineGoroutines {
		t.Skip("holds a worker of the event loop")
	}
	ln := loopbackListener(t)
	fe := freeFrontend(t)
	svc := service("answers", fe, ln.Addr().(*net.TCPAddr).AddrPort())
	svc.FirstByteTimeout = 5 * time.Second
	h := newHarness(t, Config{Workers: 1}, svc)
	b := h.fwd.snap.Load().Route(lb.TCP, fe).Backends()[0]
	b.ReportFailure(time.Now().Add(-time.Hour)) // a failure long ago: counted, no cool-down now
	c, bc := openThrough(t, fe, ln)
	release := stallWorkers(t, h)
	if _, err := io.WriteString(c, "question"); err != nil {
		t.Fatal(err)
	}
	_ = c.CloseWrite()
	if _, err := io.WriteString(bc, "answer"); err != nil {
		t.Fatal(err)
	}
	bc.Close()
	time.Sleep(20 * time.Millisecond)
	release()
	if got, err := io.ReadAll(c); err != nil || string(got) != "answer" {
		t.Fatalf("the client read %q, %v; want the answer, then EOF", got, err)
	}
	h.settle()
	if n := b.Failures(); n != 0 {
		t.Errorf("the backend has %d consecutive failures after an answered connection, want 0", n)
	}
}
