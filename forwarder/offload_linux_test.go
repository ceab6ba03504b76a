package forwarder

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/connlog"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/offload"
	"github.com/svcproxy/svcproxy/offload/offloadtest"
)

// newOffloadHarness is a harness on the event loop whose connections are
// offloaded to a real Sockmap, or skips the test where one cannot load.
// The Sockmap is closed after the forwarder.
func newOffloadHarness(t *testing.T, cfg Config, services ...lb.Service) *harness {
	t.Helper()
	if testEngine == EngineGoroutines {
		t.Skip("offload runs on the event loop only")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_BPF, CAP_NET_ADMIN) to load the sockmap program")
	}
	s, err := offload.New(offload.Config{MaxPairs: 1024})
	if err != nil {
		t.Skipf("the kernel takes no sockmap offload: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	cfg.Engine, cfg.Offload, cfg.Offloader = EngineEventLoop, OffloadSockmap, s
	offloadAt(t, 0)
	return newHarness(t, cfg, services...)
}

// offloadAt sets offloadAfter to d until t ends; call it before starting
// the forwarder.
func offloadAt(t *testing.T, d time.Duration) {
	old := offloadAfter
	offloadAfter = d
	t.Cleanup(func() { offloadAfter = old })
}

// offloaded is how many connections h's forwarder offloaded.
func (h *harness) offloaded() float64 { return testutil.ToFloat64(h.m.offloadOK) }

// dialOffloaded dials fe with deadline d, says "hi" and reads two bytes
// back (its backend answers any two), and waits until the connection is
// offloaded, so what follows runs through the kernel.
func (h *harness) dialOffloaded(fe netip.AddrPort, d time.Duration) *net.TCPConn {
	t := h.t
	t.Helper()
	c := dial(t, fe)
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "offloaded", func() bool { return h.offloaded() == 1 })
	return c
}

func TestPrivilegedOffloadRequestResponse(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	be := startBackend(t, "rr", modeEcho)
	h := newOffloadHarness(t, Config{}, service("rr", fe, be.addr))
	c := dial(t, fe)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	for i := range 1000 {
		msg := []byte("request " + string(rune('a'+i%26)) + "\n")
		if _, err := c.Write(msg); err != nil {
			t.Fatalf("round %d: write: %v", i, err)
		}
		line, err := r.ReadBytes('\n')
		if err != nil || !bytes.Equal(line, msg) {
			t.Fatalf("round %d: got %q, %v; want %q", i, line, err, msg)
		}
	}
	if got := h.offloaded(); got != 1 {
		t.Errorf("offloaded connections: got %v, want 1", got)
	}
	c.Close()
	h.settle()
}

// TestPrivilegedOffloadLargeBothWays: 64 MiB each way at once through an
// echo backend, checksummed, then the client's FIN ends it cleanly.
func TestPrivilegedOffloadLargeBothWays(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	be := startBackend(t, "bulk", modeEcho)
	h := newOffloadHarness(t, Config{}, service("bulk", fe, be.addr))
	// Say something first, so the pair is offloaded before the bulk.
	c := h.dialOffloaded(fe, 60*time.Second)
	defer c.Close()
	const size = 64 << 20
	src := rand.NewChaCha8([32]byte{1})
	sent := sha256.New()
	errc := make(chan error, 1)
	go func() {
		_, err := io.CopyN(io.MultiWriter(c, sent), src, size)
		if err == nil {
			err = c.CloseWrite()
		}
		errc <- err
	}()
	got := sha256.New()
	n, err := io.Copy(got, c)
	if err != nil || n != size {
		t.Fatalf("read back %d bytes, %v; want %d and EOF", n, err, size)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Sum(nil), sent.Sum(nil)) {
		t.Fatal("the bytes read back differ from those sent")
	}
	h.settle()
}

// TestPrivilegedOffloadHalfClose: a FIN passes through an offloaded
// connection in both orders, after every byte before it, while the other
// direction goes on.
func TestPrivilegedOffloadHalfClose(t *testing.T) {
	for _, tc := range []struct {
		name        string
		clientFirst bool
	}{{"client first", true}, {"backend first", false}} {
		t.Run(tc.name, func(t *testing.T) {
			leakCheck(t)
			const size = 8 << 20
			payload := bytes.Repeat([]byte("0123456789abcdef"), size/16)
			ln := loopbackListener(t)
			beErr := make(chan error, 1)
			go func() { // the backend: the mirror of the client below
				c, err := ln.AcceptTCP()
				if err != nil {
					beErr <- err
					return
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				beErr <- halfCloseSide(c, payload, !tc.clientFirst)
			}()
			fe := freeFrontend(t)
			h := newOffloadHarness(t, Config{}, service("hc", fe, ln.Addr().(*net.TCPAddr).AddrPort()))
			c := dial(t, fe)
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			if err := halfCloseSide(c, payload, tc.clientFirst); err != nil {
				t.Fatalf("client: %v", err)
			}
			if err := <-beErr; err != nil {
				t.Fatalf("backend: %v", err)
			}
			if got := h.offloaded(); got != 1 {
				t.Errorf("offloaded connections: got %v, want 1", got)
			}
			h.settle()
		})
	}
}

// halfCloseSide is one end of the half-close test: both ends say "ok" and
// read the other's, so the pair is offloaded; then the first sends payload
// and its FIN, the other reads all of it and EOF and only then sends
// payload and its FIN back.
func halfCloseSide(c *net.TCPConn, payload []byte, first bool) error {
	if _, err := c.Write([]byte("ok")); err != nil {
		return err
	}
	if _, err := io.ReadFull(c, make([]byte, 2)); err != nil {
		return err
	}
	send := func() error {
		if _, err := c.Write(payload); err != nil {
			return err
		}
		return c.CloseWrite()
	}
	recv := func() error {
		got, err := io.ReadAll(c)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, payload) {
			return errors.New("received bytes differ from those sent")
		}
		return nil
	}
	if first {
		if err := send(); err != nil {
			return err
		}
		return recv()
	}
	if err := recv(); err != nil {
		return err
	}
	return send()
}

// TestPrivilegedOffloadBackendReset: a backend's reset reaches the client
// of an offloaded connection as a reset.
func TestPrivilegedOffloadBackendReset(t *testing.T) {
	leakCheck(t)
	ln := loopbackListener(t)
	go func() {
		c, err := ln.AcceptTCP()
		if err != nil {
			return
		}
		_, _ = io.ReadFull(c, make([]byte, 2))
		_, _ = c.Write([]byte("ok"))
		_, _ = io.ReadFull(c, make([]byte, 4)) // offloaded by now
		_ = c.SetLinger(0)
		c.Close()
	}()
	fe := freeFrontend(t)
	h := newOffloadHarness(t, Config{}, service("rst", fe, ln.Addr().(*net.TCPAddr).AddrPort()))
	c := h.dialOffloaded(fe, 10*time.Second)
	defer c.Close()
	if _, err := c.Write([]byte("more")); err != nil {
		t.Fatal(err)
	}
	_, err := c.Read(make([]byte, 1))
	if !isReset(err) {
		t.Fatalf("client read: %v, want a reset", err)
	}
	h.settle()
	if got := testutil.ToFloat64(h.m.closes[reasonBackendReset]); got != 1 {
		t.Errorf("backend_reset closes: got %v, want 1", got)
	}
}

// TestPrivilegedOffloadConcurrent: 200 connections at once, each
// exchanging its own bytes.
func TestPrivilegedOffloadConcurrent(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	be := startBackend(t, "many", modeEcho)
	h := newOffloadHarness(t, Config{}, service("many", fe, be.addr))
	const conns = 200
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp", fe.String(), 5*time.Second)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			msg := bytes.Repeat([]byte{byte(i)}, 4096+i)
			for round := range 5 {
				if _, err := c.Write(msg); err != nil {
					errs <- err
					return
				}
				got := make([]byte, len(msg))
				if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
					errs <- errors.Join(errors.New("echo differs"), err)
					return
				}
				_ = round
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	h.settle()
	if got := h.offloaded(); got < conns/2 {
		t.Errorf("offloaded connections: got %v of %d", got, conns)
	}
	t.Logf("offloaded %v of %d connections", h.offloaded(), conns)
}

// TestPrivilegedOffloadConnectionLog: the log's byte counts include what
// the kernel moved.
func TestPrivilegedOffloadConnectionLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "connections.log")
	cl, err := connlog.Open(connlog.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	leakCheck(t)
	fe := freeFrontend(t)
	be := startBackend(t, "log", modeEcho)
	h := newOffloadHarness(t, Config{ConnLog: cl}, service("log", fe, be.addr))
	c := h.dialOffloaded(fe, 10*time.Second)
	const size = 1 << 20
	go func() { _, _ = c.Write(make([]byte, size)); _ = c.CloseWrite() }()
	if n, err := io.Copy(io.Discard, c); n != size || err != nil {
		t.Fatalf("echo: %d bytes, %v; want %d", n, err, size)
	}
	c.Close()
	h.settle()
	if err := cl.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		In  int64  `json:"bytes_in"`
		Out int64  `json:"bytes_out"`
		Cls string `json:"close"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(data), &rec); err != nil {
		t.Fatalf("log %s: %v", data, err)
	}
	if rec.In != size+2 || rec.Out != size+2 {
		t.Errorf("logged bytes in %d, out %d; want %d each", rec.In, rec.Out, size+2)
	}
}

// TestPrivilegedOffloadIdle: bytes the kernel moves count as activity; a
// quiet offloaded connection still times out.
func TestPrivilegedOffloadIdle(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	be := startBackend(t, "idle", modeEcho)
	h := newOffloadHarness(t, Config{IdleTimeout: 400 * time.Millisecond}, service("idle", fe, be.addr))
	c := dial(t, fe)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	for range 12 { // 1.2 s of traffic, three idle timeouts' worth
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			t.Fatalf("busy connection closed: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := h.offloaded(); got != 1 {
		t.Fatalf("offloaded connections: got %v, want 1", got)
	}
	start := time.Now()
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read a byte from an idle connection")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("idle connection closed after %v, want about 400ms", d)
	}
	h.settle()
}

// TestOffloadFallback: with an offloader that fails every insertion, or
// one that moves nothing (the fake), connections work in user space and
// are counted.
func TestOffloadFallback(t *testing.T) {
	if testEngine == EngineGoroutines {
		t.Skip("offload runs on the event loop only")
	}
	for _, tc := range []struct {
		name       string
		fake       *offloadtest.Fake
		ok, failed float64
	}{
		{"insert fails", &offloadtest.Fake{InsertErr: errors.New("map full")}, 0, 3},
		{"inserted", &offloadtest.Fake{}, 3, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leakCheck(t)
			offloadAt(t, 0)
			fe := freeFrontend(t)
			be := startBackend(t, "fb", modeName)
			h := newHarness(t, Config{Engine: EngineEventLoop, Offload: OffloadSockmap, Offloader: tc.fake}, service("fb", fe, be.addr))
			for range 3 {
				if got := askName(t, fe); got != "fb" {
					t.Fatalf("got %q, want fb", got)
				}
			}
			h.settle()
			if ok, failed := h.offloaded(), testutil.ToFloat64(h.m.offloadFailed); ok != tc.ok || failed != tc.failed {
				t.Errorf("offloaded ok %v failed %v; want %v, %v", ok, failed, tc.ok, tc.failed)
			}
			if ins, rem, open := tc.fake.Stats(); ins != rem || open != 0 {
				t.Errorf("fake: %d inserted, %d removed, %d still in", ins, rem, open)
			}
		})
	}
}

// TestOffloadWaitsForAge: a connection younger than offloadAfter stays in
// user space however many bytes it moves; one that is older is offloaded
// when it next moves bytes, and one that is older but silent is not
// offloaded until it does.
func TestOffloadWaitsForAge(t *testing.T) {
	if testEngine == EngineGoroutines {
		t.Skip("offload runs on the event loop only")
	}
	leakCheck(t)
	const age = 300 * time.Millisecond
	offloadAt(t, age)
	fe := freeFrontend(t)
	be := startBackend(t, "echo", modeEcho)
	fake := &offloadtest.Fake{}
	h := newHarness(t, Config{Engine: EngineEventLoop, Offload: OffloadSockmap, Offloader: fake, Workers: 1}, service("echo", fe, be.addr))
	echo := func(c net.Conn, msg string) {
		t.Helper()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, len(msg))); err != nil {
			t.Fatal(err)
		}
	}

	short := dial(t, fe)
	for range 20 { // a connection per request and its first moments: many exchanges, young
		echo(short, "ping")
	}
	short.Close()
	old := dial(t, fe)
	defer old.Close()
	echo(old, "a")
	start := time.Now()
	time.Sleep(age + 100*time.Millisecond)
	if got := h.offloaded(); got != 0 {
		t.Fatalf("%v offloaded before any connection was %v old and moved bytes; want 0", got, age)
	}
	echo(old, "b") // old now: offloaded at these bytes
	waitFor(t, "the old connection offloaded", func() bool { return h.offloaded() == 1 })
	if time.Since(start) < age {
		t.Fatalf("offloaded %v after its first bytes; want at least %v", time.Since(start), age)
	}
	echo(old, "c") // the fake moves nothing: user space still relays
	old.Close()
	h.settle()
	if ins, rem, open := fake.Stats(); ins != 1 || rem != 1 || open != 0 {
		t.Errorf("fake: %d inserted, %d removed, %d still in; want 1, 1, 0", ins, rem, open)
	}
}

// TestPrivilegedOffloadHandover: restart under load. The predecessor
// loads its own Sockmap (Config.Offload alone, the daemon's path); its
// offloaded connection keeps flowing while it drains after handing its
// sockets to a successor, which offloads the new connections in a Sockmap
// of its own; none fails.
func TestPrivilegedOffloadHandover(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_BPF, CAP_NET_ADMIN) to load the sockmap program")
	}
	if s, err := offload.New(offload.Config{MaxPairs: 16}); err != nil {
		t.Skipf("the kernel takes no sockmap offload: %v", err)
	} else {
		s.Close()
	}
	leakCheck(t)
	offloadAt(t, 0)
	bpf0 := bpfFDs(t)
	echo := startBackend(t, "echo", modeEcho)
	fe := freeFrontend(t)
	store := lb.NewStore(lb.StoreOptions{})
	snap, err := store.Replace([]lb.Service{service("tcp", fe, echo.addr)})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Engine: EngineEventLoop, Offload: OffloadSockmap, BindFrontends: true, Mark: -1, Workers: 2,
		DrainTimeout: 10 * time.Second, Logger: zap.NewNop()}
	ma, mb := NewMetrics(nil), NewMetrics(nil)
	cfg.Metrics = ma
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Apply(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	long := dial(t, fe)
	defer long.Close()
	transfer := func(size int) error { // size bytes there and back
		_ = long.SetDeadline(time.Now().Add(10 * time.Second))
		errc := make(chan error, 1)
		go func() { _, err := long.Write(make([]byte, size)); errc <- err }()
		if _, err := io.ReadFull(long, make([]byte, size)); err != nil {
			return err
		}
		return <-errc
	}
	if err := transfer(1 << 10); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the long connection offloaded", func() bool { return testutil.ToFloat64(ma.offloadOK) == 1 })

	stopLoad := connectionLoad(fe, func(c net.Conn) error {
		for _, msg := range []string{"xy", "zz"} { // the second exchange goes through the kernel
			if _, err := c.Write([]byte(msg)); err != nil {
				return err
			}
			if _, err := io.ReadFull(c, make([]byte, 2)); err != nil {
				return err
			}
		}
		return nil
	})
	time.Sleep(100 * time.Millisecond)
	files, err := a.Sockets()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Inherited, cfg.Metrics = files, mb
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	bClosed := false
	defer func() {
		if !bClosed {
			_ = b.Shutdown(context.Background())
		}
	}()
	if err := b.Apply(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	shutdownDone := make(chan struct{})
	go func() { _ = a.Shutdown(context.Background()); close(shutdownDone) }()
	time.Sleep(200 * time.Millisecond)
	for range 4 { // a drains: its offloaded connection still flows
		if err := transfer(4 << 20); err != nil {
			t.Fatalf("offloaded connection broke while its forwarder drained: %v", err)
		}
	}
	select {
	case <-shutdownDone:
		t.Fatal("the predecessor finished draining with its connection open")
	default:
	}
	long.Close()
	<-shutdownDone
	done, failed := stopLoad()
	if failed != 0 {
		t.Fatalf("%d of %d connections failed across the handover", failed, done)
	}
	if n := testutil.ToFloat64(mb.offloadOK); n == 0 {
		t.Error("the successor offloaded no connection")
	}
	_ = b.Shutdown(context.Background())
	bClosed = true
	if n := bpfFDs(t); n != bpf0 {
		t.Errorf("BPF descriptors open after both forwarders shut down: %d, want %d", n, bpf0)
	}
	t.Logf("%d connections across the handover, none failed; offloaded by a %v, by b %v",
		done, testutil.ToFloat64(ma.offloadOK), testutil.ToFloat64(mb.offloadOK))
}

// TestPrivilegedOffloadDrain: an offloaded connection to an endpoint that
// left its Service is closed at the drain timeout, with the kernel's bytes
// in its counts.
func TestPrivilegedOffloadDrain(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	be := startBackend(t, "drain", modeEcho)
	other := startBackend(t, "other", modeEcho)
	h := newOffloadHarness(t, Config{DrainTimeout: 300 * time.Millisecond}, service("drain", fe, be.addr))
	c := dial(t, fe)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	for range 3 {
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, 4)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "offloaded", func() bool { return h.offloaded() == 1 })
	h.replace(service("drain", fe, other.addr))
	start := time.Now()
	if _, err := io.Copy(io.Discard, c); err != nil && !isReset(err) {
		t.Fatalf("draining connection: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("closed after %v, want about the 300ms drain timeout", d)
	}
	h.settle()
	if got := testutil.ToFloat64(h.m.closes[reasonDrain]); got != 1 {
		t.Errorf("drain closes: got %v, want 1", got)
	}
	if in, out := testutil.ToFloat64(h.m.bytesIn), testutil.ToFloat64(h.m.bytesOut); in != 12 || out != 12 {
		t.Errorf("bytes in %v out %v, want 12 each (the first exchange by the loop, the rest by the kernel)", in, out)
	}
}

// bpfFDs counts this process's open BPF map and program descriptors.
func bpfFDs(t *testing.T) int {
	n := 0
	for _, target := range fdTargets(t) {
		if strings.HasPrefix(target, "anon_inode:bpf-") {
			n++
		}
	}
	return n
}
