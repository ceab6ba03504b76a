package forwarder

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The connection state machine's edges, on whichever engine the tests run
// (SVCPROXY_FORWARDER_ENGINE): every case holds for both.

// TestHalfCloseBackendFirst: the backend finishes first (a greeting, then
// its FIN) and the client goes on sending; the proxy passes the FIN to the
// client and keeps the other direction open until the client ends too.
func TestHalfCloseBackendFirst(t *testing.T) {
	leakCheck(t)
	ln := loopbackListener(t)
	received := make(chan []byte, 1)
	go func() {
		c, err := ln.AcceptTCP()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.WriteString(c, "hello, then goodbye\n")
		_ = c.CloseWrite()
		got, _ := io.ReadAll(c)
		received <- got
	}()
	fe := freeFrontend(t)
	h := newHarness(t, Config{}, service("greeter", fe, ln.Addr().(*net.TCPAddr).AddrPort()))
	c := dial(t, fe)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	greeting, err := io.ReadAll(c) // to the backend's FIN
	if err != nil || string(greeting) != "hello, then goodbye\n" {
		t.Fatalf("greeting %q, %v; want it then EOF", greeting, err)
	}
	msg := bytes.Repeat([]byte("after your FIN "), 20000) // past one buffer: splicing too
	if _, err := c.Write(msg); err != nil {
		t.Fatalf("writing after the backend's FIN: %v", err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-received:
		if !bytes.Equal(got, msg) {
			t.Fatalf("backend received %d bytes after its FIN, want %d", len(got), len(msg))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the backend never saw the client's bytes and FIN")
	}
	h.settle()
	if got := testutil.ToFloat64(h.m.closes[reasonBackendEOF]); got != 1 {
		t.Errorf("backend_eof closes = %v, want 1", got)
	}
}

// TestBackPressureSlowReader: a backend that sends faster than the client
// reads is held back by the proxy (it stops reading the backend while the
// client's socket is full) instead of the proxy buffering without bound,
// and every byte arrives in order once the client reads.
func TestBackPressureSlowReader(t *testing.T) {
	leakCheck(t)
	// Loopback sockets here autotune up to 32 MiB of receive buffer, so
	// the sockets on the way may hold tens of MiB: send far more.
	const total = 256 << 20
	ln := loopbackListener(t)
	var sent atomic.Int64
	go func() {
		c, err := ln.AcceptTCP()
		if err != nil {
			return
		}
		defer c.Close()
		const chunk = 256 << 10
		pattern := make([]byte, chunk+251)
		for i := range pattern {
			pattern[i] = byte(i % 251)
		}
		for off := 0; off < total; off += chunk {
			n, err := c.Write(pattern[off%251 : off%251+chunk])
			sent.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	fe := freeFrontend(t)
	newHarness(t, Config{}, service("firehose", fe, ln.Addr().(*net.TCPAddr).AddrPort()))
	c := dial(t, fe)
	defer c.Close()
	// Read nothing for a while: what the backend got out is bounded by the
	// socket buffers on the way and one chunk in the proxy.
	var stalled int64
	waitFor(t, "the backend held back (sending nothing for 200ms)", func() bool {
		before := sent.Load()
		time.Sleep(200 * time.Millisecond)
		stalled = sent.Load()
		return stalled == before && stalled > 0
	})
	if stalled >= total/2 {
		t.Fatalf("the backend sent %d of %d bytes with the client reading nothing: no back-pressure", stalled, total)
	}
	t.Logf("backend stalled after %d KiB with the client not reading", stalled>>10)
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReaderSize(c, 64<<10)
	buf := make([]byte, 32<<10)
	pattern := make([]byte, len(buf)+251)
	for i := range pattern {
		pattern[i] = byte(i % 251)
	}
	for off := 0; off < total; {
		n, err := r.Read(buf)
		if !bytes.Equal(buf[:n], pattern[off%251:off%251+n]) {
			t.Fatalf("bytes %d to %d differ from what the backend sent", off, off+n)
		}
		off += n
		if err != nil {
			t.Fatalf("after %d bytes: %v", off, err)
		}
		if off < 4<<20 {
			time.Sleep(time.Millisecond) // slow at first, then full speed
		}
	}
}

// TestIPv6 forwards between IPv6 loopback client, frontend and backend,
// and sees the client's IPv6 address in the connection's record.
func TestIPv6(t *testing.T) {
	leakCheck(t)
	ln, err := net.ListenTCP("tcp6", &net.TCPAddr{IP: net.IPv6loopback})
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.WriteString(c, "via "+c.RemoteAddr().String()+"\n")
				_, _ = copyPlain(c, c)
			}()
		}
	}()
	probe, err := net.ListenTCP("tcp6", &net.TCPAddr{IP: net.IPv6loopback})
	if err != nil {
		t.Fatal(err)
	}
	fe := probe.Addr().(*net.TCPAddr).AddrPort()
	probe.Close()
	newHarness(t, Config{}, service("v6", fe, ln.Addr().(*net.TCPAddr).AddrPort()))
	c := dial(t, fe)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if ap, err := netip.ParseAddrPort(line[len("via ") : len(line)-1]); err != nil || ap.Addr() != netip.IPv6Loopback() {
		t.Fatalf("backend saw the proxy as %q, want an IPv6 loopback address", line)
	}
	if _, err := io.WriteString(c, "echo\n"); err != nil {
		t.Fatal(err)
	}
	if got, err := r.ReadString('\n'); err != nil || got != "echo\n" {
		t.Fatalf("echo over IPv6: %q, %v", got, err)
	}
}

// TestResetAfterHalfClosePassedOn: the client sends its request and its
// FIN; the backend answers part of the response and then resets. The
// client sees the reset, not a clean end after a truncated response, and
// the connection counts as ended by the backend's reset.
func TestResetAfterHalfClosePassedOn(t *testing.T) {
	leakCheck(t)
	ln, fe, h := proxiedBackend(t, "resetter")
	go func() {
		c, err := ln.AcceptTCP()
		if err != nil {
			return
		}
		_, _ = io.ReadAll(c) // the request, to the client's FIN
		_, _ = io.WriteString(c, "part of the ans")
		time.Sleep(50 * time.Millisecond) // the part reaches the client first
		_ = c.SetLinger(0)
		c.Close()
	}()
	c := dial(t, fe)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "request"); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err == nil {
		t.Fatalf("read %q and then a clean EOF; want the backend's reset passed on", got)
	}
	h.settle()
	if got := testutil.ToFloat64(h.m.closes[reasonBackendReset]); got != 1 {
		t.Errorf("backend_reset closes = %v, want 1 (client_eof: %v)", got, testutil.ToFloat64(h.m.closes[reasonClientEOF]))
	}
}

// TestDrainAfterEndpointFlaps: a connection's endpoint leaves, comes back
// within the drain timeout (the connection stays, no longer draining),
// then leaves again: the connection drains anew and is closed.
func TestDrainAfterEndpointFlaps(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	a, b := startBackend(t, "a", modeNameThenSink), startBackend(t, "b", modeName)
	const drain = 200 * time.Millisecond
	h := newHarness(t, Config{DrainTimeout: drain}, service("flap", fe, a.addr))
	c := dial(t, fe)
	defer c.Close()
	r := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if name, err := r.ReadString('\n'); err != nil || name != "a\n" {
		t.Fatalf("reading the backend's name: %q, %v", name, err)
	}
	draining := func(want float64) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for testutil.ToFloat64(h.m.Draining) != want {
			if time.Now().After(deadline) {
				t.Fatalf("draining connections = %v, want %v", testutil.ToFloat64(h.m.Draining), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	h.replace(service("flap", fe, b.addr))
	draining(1)
	h.replace(service("flap", fe, a.addr, b.addr))
	time.Sleep(2 * drain) // the drain deadline passes with a listed again
	draining(0)
	if _, err := c.Write([]byte("still here")); err != nil {
		t.Fatalf("the connection after its endpoint came back: %v", err)
	}
	h.replace(service("flap", fe, b.addr))
	draining(1)
	_ = c.SetReadDeadline(time.Now().Add(10 * drain))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("read more from a backend that left twice")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("not closed within %v of its endpoint's second removal (drain timeout %v)", 10*drain, drain)
	}
	h.settle()
	draining(0)
	if got := testutil.ToFloat64(h.m.closes[reasonDrain]); got != 1 {
		t.Errorf("drain closes = %v, want 1", got)
	}
}
