package forwarder

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/svcproxy/svcproxy/connlog"
	"github.com/svcproxy/svcproxy/lb"
)

func TestRoundRobinSpreadsEvenly(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	var addrs []netip.AddrPort
	for _, n := range []string{"a", "b", "c"} {
		addrs = append(addrs, startBackend(t, n, modeName).addr)
	}
	newHarness(t, Config{}, service("rr", fe, addrs...))
	got := map[string]int{}
	for i := 0; i < 300; i++ {
		got[askName(t, fe)]++
	}
	for _, n := range []string{"a", "b", "c"} {
		if got[n] != 100 {
			t.Errorf("backend %s served %d of 300 connections, want 100 (all: %v)", n, got[n], got)
		}
	}
}

func TestAffinitySticksAndExpires(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	var addrs []netip.AddrPort
	for _, n := range []string{"a", "b", "c"} {
		addrs = append(addrs, startBackend(t, n, modeName).addr)
	}
	svc := service("sticky", fe, addrs...)
	svc.AffinityTimeout = 300 * time.Millisecond
	newHarness(t, Config{}, svc)
	first := askName(t, fe)
	for i := 0; i < 20; i++ {
		if got := askName(t, fe); got != first {
			t.Fatalf("connection %d went to %s, want %s (affinity)", i, got, first)
		}
	}
	time.Sleep(400 * time.Millisecond)
	if got := askName(t, fe); got == first {
		t.Errorf("after the affinity timeout the client stayed on %s; round robin should move it", got)
	}
}

func TestRetryOnRefused(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	a, b := startBackend(t, "a", modeName), startBackend(t, "b", modeName)
	bad := refusingAddr(t)
	h := newHarness(t, Config{}, service("retry", fe, a.addr, bad, b.addr))
	for i := 0; i < 1000; i++ {
		name := askName(t, fe)
		if name != "a" && name != "b" {
			t.Fatalf("connection %d: got %q", i, name)
		}
	}
	refused := testutil.ToFloat64(h.m.dialRefused)
	if refused < 1 || refused > 5 {
		t.Errorf("the refusing backend was dialled %v times in 1000 connections; want 1 to 5 (passive health cool-down)", refused)
	}
	if ok := testutil.ToFloat64(h.m.connOK); ok != 1000 {
		t.Errorf("connections ok = %v, want 1000", ok)
	}
}

func TestRetryOnTimeout(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	good := startBackend(t, "good", modeName)
	hole := blackholeAddr(t)
	h := newHarness(t, Config{DialTimeouts: []time.Duration{100 * time.Millisecond, time.Second}}, service("timeout", fe, hole, good.addr))
	for i := 0; i < 20; i++ {
		if got := askName(t, fe); got != "good" {
			t.Fatalf("connection %d went to %q", i, got)
		}
	}
	if n := testutil.ToFloat64(h.m.dialTimeout); n < 1 || n > 2 {
		t.Errorf("timed-out dials = %v, want 1 or 2 (cool-down after the first)", n)
	}
}

func TestAllBackendsRefusingResetsPromptly(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	newHarness(t, Config{}, service("dead", fe, refusingAddr(t), refusingAddr(t), refusingAddr(t)))
	for i := 0; i < 3; i++ {
		start := time.Now()
		expectReset(t, fe)
		if d := time.Since(start); d > time.Second {
			t.Errorf("reset took %v, want well under a second", d)
		}
	}
}

func TestNoServiceOrNoEndpointsResets(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	h := newHarness(t, Config{}, service("empty", fe))
	for _, name := range []string{"no endpoints", "no service"} {
		t.Run(name, func(t *testing.T) { expectReset(t, fe) })
	}
	if n := testutil.ToFloat64(h.m.connNoEndpoints); n != 2 {
		t.Errorf("no_endpoints connections = %v, want 2", n)
	}
}

func TestHalfClose(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	be := startBackend(t, "echo", modeEcho)
	newHarness(t, Config{}, service("echo", fe, be.addr))
	c := dial(t, fe)
	defer c.Close()
	msg := bytes.Repeat([]byte("half-close "), 10000)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading the reply after shutting down writes: %v", err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("got %d bytes back, want %d", len(got), len(msg))
	}
}

func TestOneGiBByteExact(t *testing.T) {
	if testing.Short() {
		t.Skip("1 GiB transfer skipped in -short mode")
	}
	leakCheck(t)
	fe := freeFrontend(t)
	be := startBackend(t, "echo", modeEcho)
	newHarness(t, Config{}, service("bulk", fe, be.addr))
	c := dial(t, fe)
	defer c.Close()
	const size = 1 << 30
	sent, recv := sha256.New(), sha256.New()
	var wg sync.WaitGroup
	var werr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.NewChaCha8([32]byte{1})
		buf := make([]byte, 1<<20)
		for n := 0; n < size; n += len(buf) {
			_, _ = rng.Read(buf)
			sent.Write(buf)
			if _, err := c.Write(buf); err != nil {
				werr = err
				return
			}
		}
		werr = c.CloseWrite()
	}()
	n, err := io.Copy(recv, c)
	wg.Wait()
	if err != nil || werr != nil {
		t.Fatalf("transfer: read %v, write %v", err, werr)
	}
	if n != size {
		t.Fatalf("got %d bytes back, want %d", n, size)
	}
	if !bytes.Equal(sent.Sum(nil), recv.Sum(nil)) {
		t.Fatal("checksums differ")
	}
}

func TestIdleTimeoutClosesIdlePair(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	be := startBackend(t, "echo", modeEcho)
	h := newHarness(t, Config{IdleTimeout: 200 * time.Millisecond}, service("idle", fe, be.addr))

	// An active connection outlives the idle timeout.
	busy := dial(t, fe)
	defer busy.Close()
	r := bufio.NewReader(busy)
	for i := 0; i < 8; i++ {
		if _, err := busy.Write([]byte("ping\n")); err != nil {
			t.Fatal(err)
		}
		_ = busy.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatalf("busy connection broke after %d pings: %v", i, err)
		}
		time.Sleep(60 * time.Millisecond)
	}
	busy.Close()

	// An idle one is closed.
	start := time.Now()
	idle := dial(t, fe)
	defer idle.Close()
	_ = idle.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := idle.Read(make([]byte, 1))
	if err != io.EOF {
		t.Fatalf("idle connection: read error %v, want EOF", err)
	}
	if d := time.Since(start); d < 200*time.Millisecond || d > 1500*time.Millisecond {
		t.Errorf("idle connection closed after %v, want 200ms-1.5s", d)
	}
	h.settle()
	if n := testutil.ToFloat64(h.m.closes[reasonIdle]); n != 1 {
		t.Errorf("idle closes = %v, want 1", n)
	}
}

func TestDrainKeepsConnectionToRemovedBackend(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	a, b := startBackend(t, "a", modeName), startBackend(t, "b", modeName)
	h := newHarness(t, Config{DrainTimeout: 700 * time.Millisecond}, service("drain", fe, a.addr, b.addr))

	c := dial(t, fe)
	defer c.Close()
	r := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	name, err := r.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	name = strings.TrimSpace(name)
	keep := b.addr
	if name == "b" {
		keep = a.addr
	}
	h.replace(service("drain", fe, keep))
	// Apply hands the drain pass to the connection's worker: it lands soon
	// after, not within the call.
	waitFor(t, "one connection draining", func() bool { return testutil.ToFloat64(h.m.Draining) == 1 })

	// The open connection still works…
	if _, err := c.Write([]byte("still here\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := r.ReadString('\n'); err != nil || line != "still here\n" {
		t.Fatalf("after its backend was removed: %q, %v", line, err)
	}
	// …new connections go to the remaining backend…
	for i := 0; i < 5; i++ {
		if got := askName(t, fe); got == name {
			t.Fatalf("new connection went to removed backend %s", got)
		}
	}
	// …and the drain timeout ends it.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("draining connection still open after the drain timeout")
	}
	h.settle()
	if got := testutil.ToFloat64(h.m.closes[reasonDrain]); got != 1 {
		t.Errorf("drain closes = %v, want 1", got)
	}
}

func TestManyConcurrentConnectionsNoLeaks(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	var addrs []netip.AddrPort
	for _, n := range []string{"a", "b", "c"} {
		addrs = append(addrs, startBackend(t, n, modeEcho).addr)
	}
	h := newHarness(t, Config{}, service("many", fe, addrs...))
	const n = 2000
	conns := make([]*net.TCPConn, 0, n)
	for i := 0; i < n; i++ {
		conns = append(conns, dial(t, fe))
	}
	deadline := time.Now().Add(10 * time.Second)
	for h.fwd.Active() != n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := h.fwd.Active(); got != n {
		t.Fatalf("active connections = %d, want %d (ok %v, dial failed %v, accept errors %v, refused %v timeouts %v)", got, n,
			testutil.ToFloat64(h.m.connOK), testutil.ToFloat64(h.m.connDialFailed), testutil.ToFloat64(h.m.acceptOther)+testutil.ToFloat64(h.m.acceptFDLimit),
			testutil.ToFloat64(h.m.dialRefused), testutil.ToFloat64(h.m.dialTimeout))
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			msg := []byte("hello from " + string(rune('A'+i%26)) + "\n")
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Write(msg); err != nil {
				errs <- err
				return
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
				errs <- errors.Join(err, errors.New("echo mismatch"))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for h.fwd.Active() != 0 && time.Now().Before(deadline.Add(5*time.Second)) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := h.fwd.Active(); got != 0 {
		t.Fatalf("active connections after close = %d, want 0", got)
	}
}

func TestConnectionLimits(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	be := startBackend(t, "echo", modeEcho)
	h := newHarness(t, Config{MaxConnsPerService: 2}, service("capped", fe, be.addr))
	var open []*net.TCPConn
	for i := 0; i < 2; i++ {
		c := dial(t, fe)
		defer c.Close()
		open = append(open, c)
	}
	for h.fwd.Active() != 2 {
		time.Sleep(5 * time.Millisecond)
	}
	expectReset(t, fe)
	if n := testutil.ToFloat64(h.m.connLimit); n != 1 {
		t.Errorf("limit rejections = %v, want 1", n)
	}
}

func TestShutdownDrainsThenCloses(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	be := startBackend(t, "echo", modeEcho)
	h := newHarness(t, Config{DrainTimeout: 300 * time.Millisecond}, service("shut", fe, be.addr))
	c := dial(t, fe)
	defer c.Close()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := h.fwd.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("shutdown returned after %v, before the drain timeout", d)
	}
	if _, err := net.DialTimeout("tcp", fe.String(), time.Second); err == nil {
		t.Error("still accepting after shutdown")
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("connection still open after shutdown")
	}
}

func TestConnectionLogShowsEveryAttempt(t *testing.T) {
	// Opened before the leak check: lumberjack keeps one goroutine per
	// log for its whole life.
	path := filepath.Join(t.TempDir(), "connections.log")
	cl, err := connlog.Open(connlog.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	leakCheck(t)
	fe := freeFrontend(t)
	good := startBackend(t, "good", modeName)
	bad := refusingAddr(t)
	// Round robin over two backends: within two connections one of them
	// picks the refusing backend first and retries on the good one.
	svc := service("logged", fe, bad, good.addr)
	svc.Algorithm = lb.RoundRobin
	h := newHarness(t, Config{ConnLog: cl}, svc)
	for i := 0; i < 2; i++ {
		askName(t, fe)
	}
	h.settle()
	if err := cl.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	type attempt struct {
		Backend string `json:"backend"`
		Error   string `json:"error"`
	}
	var retried bool
	for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		var rec struct {
			Attempts []attempt `json:"attempts"`
			Backend  string    `json:"backend"`
			Close    string    `json:"close"`
		}
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("bad log line %s: %v", line, err)
		}
		if len(rec.Attempts) == 2 {
			retried = true
			if rec.Attempts[0].Backend != bad.String() || rec.Attempts[0].Error == "" {
				t.Errorf("first attempt = %+v, want a failure at %v", rec.Attempts[0], bad)
			}
			if rec.Attempts[1].Backend != good.addr.String() || rec.Attempts[1].Error != "" || rec.Backend != good.addr.String() {
				t.Errorf("second attempt = %+v, chosen %s; want success at %v", rec.Attempts[1], rec.Backend, good.addr)
			}
		}
	}
	if !retried {
		t.Fatalf("no log line with two attempts in:\n%s", data)
	}
}

// TestClientLeavingCancelsDial: a client that leaves while its dial is
// pending cancels it: one that closes having sent nothing, and one that
// resets after sending bytes (which a peek alone would see, not the reset).
func TestClientLeavingCancelsDial(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sent  string
		reset bool
	}{
		{"closes", "", false},
		{"sends bytes, then resets", "hello", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leakCheck(t)
			fe := freeFrontend(t)
			hole := blackholeAddr(t)
			h := newHarness(t, Config{DialTimeouts: []time.Duration{5 * time.Second}}, service("hole", fe, hole))
			c := dial(t, fe)
			if _, err := c.Write([]byte(tc.sent)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
			if tc.reset {
				_ = c.SetLinger(0)
			}
			c.Close()
			deadline := time.Now().Add(2 * time.Second)
			for testutil.ToFloat64(h.m.connClientGone) != 1 {
				if time.Now().After(deadline) {
					t.Fatal("the dial was not cancelled within 2s of the client leaving (dial timeout 5s)")
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// TestEndpointRemovedWhileDialling: a snapshot that removes the backend
// lands after the connection was routed and dialled but before it joined
// the open set (so Apply's drain pass did not see it). The connection
// drains like any other to that backend instead of failing the client.
func TestEndpointRemovedWhileDialling(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	a, b := startBackend(t, "a", modeName), startBackend(t, "b", modeName)
	h := newHarness(t, Config{DrainTimeout: 5 * time.Second}, service("race", fe, a.addr))
	hook := func() {
		testHookAdded.Store(nil)
		h.replace(service("race", fe, b.addr))
	}
	testHookAdded.Store(&hook)
	defer testHookAdded.Store(nil)
	c := dial(t, fe)
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	name, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("the client of a connection whose backend left mid-dial: %v", err)
	}
	if name != "a\n" {
		t.Errorf("served by %q, want a (the backend it was dialled to)", name)
	}
	if got := testutil.ToFloat64(h.m.Draining); got != 1 {
		t.Errorf("draining connections = %v, want 1", got)
	}
	if got := askName(t, fe); got != "b" {
		t.Errorf("the next connection went to %q, want b", got)
	}
}

// TestSmallMessagesNeverStall: a direction switches between buffered and
// spliced chunks as message sizes change (see How bytes move). Ping-pong of
// random sizes, back-to-back bursts and the odd bulk chunk, over several
// connections at once, must arrive byte-exact and never wait for bytes that
// were sent.
func TestSmallMessagesNeverStall(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	be := startBackend(t, "echo", modeEcho)
	newHarness(t, Config{}, service("echo", fe, be.addr))
	rounds := 1500
	if testing.Short() || raceEnabled {
		rounds = 300
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(fe))
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			got := make([]byte, 200<<10)
			for i := range rounds {
				// Mostly one small message; sometimes a burst of them
				// written back to back; now and then one over the
				// buffer, which turns splicing on for a while.
				var msg []byte
				switch k := rng.IntN(20); {
				case k == 0:
					msg = make([]byte, 100<<10+rng.IntN(100<<10))
				case k < 4:
					msg = make([]byte, 0, 4096)
					for range 1 + rng.IntN(8) {
						msg = append(msg, make([]byte, 1+rng.IntN(200))...)
					}
				default:
					msg = make([]byte, 1+rng.IntN(2048))
				}
				for j := range msg {
					msg[j] = byte(rng.Uint32())
				}
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				werr := make(chan error, 1)
				go func() { _, err := c.Write(msg); werr <- err }()
				if _, err := io.ReadFull(c, got[:len(msg)]); err != nil {
					errs <- fmt.Errorf("connection %d, round %d (%d bytes): %w", w, i, len(msg), err)
					return
				}
				if err := <-werr; err != nil {
					errs <- fmt.Errorf("connection %d, round %d: writing: %w", w, i, err)
					return
				}
				if !bytes.Equal(got[:len(msg)], msg) {
					errs <- fmt.Errorf("connection %d, round %d: %d bytes came back different", w, i, len(msg))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestReplyThenCloseReachesClient: a backend that answers and closes at
// once (HTTP/1.0 without a length, a server-first greeting and goodbye)
// has its reply and its FIN arrive together, and the forwarder must pass
// both on while the client only waits for EOF. Under Go's poller a FIN read
// together with the last bytes brings no new readiness edge, so a relay
// that skips the read after a short one to save an EAGAIN (nginx and
// HAProxy can: they see EPOLLRDHUP) would wait here until the idle timeout.
func TestReplyThenCloseReachesClient(t *testing.T) {
	leakCheck(t)
	ln := loopbackListener(t)
	go func() {
		for {
			c, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil {
					return
				}
				_, _ = io.WriteString(c, "reply to "+line)
			}()
		}
	}()
	fe := freeFrontend(t)
	newHarness(t, Config{IdleTimeout: time.Minute}, service("oneshot", fe, ln.Addr().(*net.TCPAddr).AddrPort()))
	for i := range 50 {
		c := dial(t, fe)
		if _, err := fmt.Fprintf(c, "request %d\n", i); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, err := io.ReadAll(c)
		c.Close()
		if want := fmt.Sprintf("reply to request %d\n", i); err != nil || string(got) != want {
			t.Fatalf("connection %d: read %q, %v; want %q then EOF", i, got, err, want)
		}
	}
}

// TestSCTPWarnedOnceNotServed: an SCTP Service port opens nothing (no TCP
// listener, no UDP socket on its frontend) and is warned about once while
// it stays, again if it comes back; TCP beside it is served as usual.
func TestSCTPWarnedOnceNotServed(t *testing.T) {
	leakCheck(t)
	core, logs := observer.New(zap.WarnLevel)
	web := freeFrontend(t)
	sctpFE := freeFrontend(t)
	b := startBackend(t, "a", modeName)
	sctpSvc := func(name string, port uint16) lb.Service {
		s := service(name, netip.AddrPortFrom(sctpFE.Addr(), port), b.addr)
		s.Protocol = lb.SCTP
		s.NodePort = port + 1
		return s
	}
	h := newHarness(t, Config{Logger: zap.New(core)}, service("web", web, b.addr), sctpSvc("diameter", sctpFE.Port()))
	warned := func() []string {
		var names []string
		for _, e := range logs.FilterMessageSnippet("SCTP is served by the kernel modes only").All() {
			names = append(names, e.ContextMap()["service"].(string))
		}
		return names
	}
	check := func(step string, want ...string) {
		t.Helper()
		if got := warned(); !slices.Equal(got, want) {
			t.Errorf("%s: warnings for %v, want %v", step, got, want)
		}
	}
	check("first Apply", "test/diameter")
	h.replace(service("web", web, b.addr), sctpSvc("diameter", sctpFE.Port()))
	check("same snapshot again", "test/diameter")
	h.replace(service("web", web, b.addr), sctpSvc("diameter", sctpFE.Port()), sctpSvc("s1ap", sctpFE.Port()+2))
	check("a second SCTP port", "test/diameter", "test/s1ap")
	h.replace(service("web", web, b.addr), sctpSvc("s1ap", sctpFE.Port()+2))
	h.replace(service("web", web, b.addr), sctpSvc("diameter", sctpFE.Port()), sctpSvc("s1ap", sctpFE.Port()+2))
	check("removed and back", "test/diameter", "test/s1ap", "test/diameter")

	if got := askName(t, web); got != "a" {
		t.Errorf("TCP beside SCTP answered by %q, want a", got)
	}
	if c, err := net.DialTimeout("tcp", sctpFE.String(), time.Second); err == nil {
		c.Close()
		t.Errorf("something listens on the SCTP frontend %v over TCP", sctpFE)
	}
	if ports := h.fwd.UDPPorts(); len(ports) != 0 {
		t.Errorf("UDP sockets %v for SCTP Services", ports)
	}
}
