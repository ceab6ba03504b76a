package forwarder

import (
	"bufio"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/lb"
)

// testBackend is a real TCP server on loopback.
type testBackend struct {
	t        testing.TB
	name     string
	ln       *net.TCPListener
	addr     netip.AddrPort
	accepted atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]bool
}

// backendMode is what a testBackend does with each connection.
type backendMode int

const (
	modeName         backendMode = iota // write "name\n", then echo until EOF
	modeEcho                            // echo until EOF, then close
	modeSink                            // read until EOF, then close
	modeNameThenSink                    // write name and a newline, then read until EOF
)

func startBackend(t testing.TB, name string, mode backendMode) *testBackend {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	b := &testBackend{t: t, name: name, ln: ln, addr: ln.Addr().(*net.TCPAddr).AddrPort(), conns: map[net.Conn]bool{}}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			c, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			b.accepted.Add(1)
			b.mu.Lock()
			b.conns[c] = true
			b.mu.Unlock()
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				defer func() {
					b.mu.Lock()
					delete(b.conns, c)
					b.mu.Unlock()
					c.Close()
				}()
				switch mode {
				case modeName:
					if _, err := io.WriteString(c, name+"\n"); err != nil {
						return
					}
					_, _ = copyPlain(c, c)
				case modeEcho:
					_, _ = copyPlain(c, c)
				case modeSink:
					_, _ = io.Copy(io.Discard, c)
				case modeNameThenSink:
					if _, err := io.WriteString(c, name+"\n"); err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, c)
				}
			}()
		}
	}()
	t.Cleanup(b.stop)
	return b
}

// stop closes the listener and every open connection.
func (b *testBackend) stop() {
	b.ln.Close()
	b.mu.Lock()
	for c := range b.conns {
		c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// refusingAddr returns a loopback address where nothing listens.
func refusingAddr(t testing.TB) netip.AddrPort {
	t.Helper()
	return freeFrontend(t)
}

// freeFrontend returns a loopback address and TCP port nothing listens on,
// for the forwarder to listen on (see freePort).
func freeFrontend(t testing.TB) netip.AddrPort {
	t.Helper()
	return freePort(t, "tcp4", loopback4)
}

var loopback4 = netip.AddrFrom4([4]byte{127, 0, 0, 1})

// handedOut holds the ports freePort has returned in this process: it
// never returns one twice, though nothing listens on it until the test
// that took it gets there.
var handedOut = struct {
	sync.Mutex
	ports map[uint16]bool
}{ports: map[uint16]bool{}}

// freePort returns ip with a port that nothing listens on for network (as
// net.Listen and net.ListenPacket take it: "tcp" on [::] holds both
// families), for the forwarder to listen on. The port is
// below the kernel's ephemeral range: one that listening on port 0 found
// free would be handed out again by the next connect or port-0 listen of
// any test running meanwhile (make test runs packages in parallel), and the
// forwarder's listen would find it taken ("address already in use"). Where
// the range leaves too little room below it, it falls back to a port-0
// listen.
func freePort(t testing.TB, network string, ip netip.Addr) netip.AddrPort {
	t.Helper()
	ephemeral := 32768 // Linux's default start, and below Windows' 49152
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 0 {
				ephemeral = n
			}
		}
	}
	const lowest = 10000
	handedOut.Lock()
	defer handedOut.Unlock()
	for try := range 100 {
		port := uint16(0)
		if ephemeral-lowest >= 1000 {
			port = uint16(lowest + rand.IntN(ephemeral-lowest))
		}
		if port != 0 && handedOut.ports[port] {
			continue
		}
		addr, err := listenAndClose(network, netip.AddrPortFrom(ip, port))
		if err != nil {
			if port == 0 && try > 10 {
				t.Fatalf("no free %s port on %s: %v", network, ip, err)
			}
			continue
		}
		if handedOut.ports[addr.Port()] {
			continue
		}
		handedOut.ports[addr.Port()] = true
		return addr
	}
	t.Fatalf("no free %s port on %s in %d-%d", network, ip, lowest, ephemeral-1)
	return netip.AddrPort{}
}

// listenAndClose listens on addr for network and closes at once, returning
// the address it got.
func listenAndClose(network string, addr netip.AddrPort) (netip.AddrPort, error) {
	if strings.HasPrefix(network, "udp") {
		pc, err := net.ListenPacket(network, addr.String())
		if err != nil {
			return netip.AddrPort{}, err
		}
		defer pc.Close()
		return pc.LocalAddr().(*net.UDPAddr).AddrPort(), nil
	}
	ln, err := net.Listen(network, addr.String())
	if err != nil {
		return netip.AddrPort{}, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).AddrPort(), nil
}

// service builds a TCP Service on frontend with ready endpoints at addrs.
func service(name string, frontend netip.AddrPort, addrs ...netip.AddrPort) lb.Service {
	svc := lb.Service{
		Name:       lb.ServicePortName{Namespace: "test", Name: name},
		Port:       frontend.Port(),
		ClusterIPs: []netip.Addr{frontend.Addr()},
	}
	for _, a := range addrs {
		svc.Endpoints = append(svc.Endpoints, lb.Endpoint{Addr: a, Ready: true, Serving: true})
	}
	return svc
}

// loopbackListener is a TCP listener on 127.0.0.1 that the test drives
// itself (accepts, answers, resets), closed with t.
func loopbackListener(t testing.TB) *net.TCPListener {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// openThrough connects to fe, takes the forwarder's connection to the
// backend from ln and sends one message across, so that the connection is
// open when it returns. Both ends close with t; c has a 5 s deadline.
func openThrough(t testing.TB, fe netip.AddrPort, ln *net.TCPListener) (c, bc *net.TCPConn) {
	t.Helper()
	c = dial(t, fe)
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	bc, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bc.Close() })
	if _, err := io.WriteString(c, "ping"); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(bc, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	return c, bc
}

// proxiedBackend starts a forwarder (harness) with one Service whose one
// backend is a listener on loopback, and returns them with the frontend.
func proxiedBackend(t *testing.T, name string) (*net.TCPListener, netip.AddrPort, *harness) {
	t.Helper()
	ln := loopbackListener(t)
	fe := freeFrontend(t)
	h := newHarness(t, Config{}, service(name, fe, ln.Addr().(*net.TCPAddr).AddrPort()))
	return ln, fe, h
}

// harness is a forwarder with frontend listeners over a Store.
type harness struct {
	t     testing.TB
	store *lb.Store
	fwd   *Forwarder
	m     *Metrics
}

// testEngine is the TCP engine the tests run on: the platform's default,
// or SVCPROXY_FORWARDER_ENGINE (make test runs the package on both).
var testEngine = Engine(os.Getenv("SVCPROXY_FORWARDER_ENGINE"))

// testIOUring is the event loop's io_uring setting in tests: auto, or
// SVCPROXY_FORWARDER_IO_URING (make test runs the package with it off too).
var testIOUring = IOUring(os.Getenv("SVCPROXY_FORWARDER_IO_URING"))

func newHarness(t testing.TB, cfg Config, services ...lb.Service) *harness {
	t.Helper()
	cfg.BindFrontends = true
	if cfg.Engine == "" {
		cfg.Engine = testEngine
	}
	if cfg.IOUring == "" {
		cfg.IOUring = testIOUring
	}
	if cfg.Mark == 0 {
		cfg.Mark = -1
	}
	if cfg.Workers == 0 {
		cfg.Workers = 2
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t, zaptest.Level(zap.DebugLevel))
	}
	h := &harness{t: t, store: lb.NewStore(lb.StoreOptions{}), m: cfg.Metrics}
	fwd, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.fwd = fwd
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = fwd.Shutdown(ctx)
	})
	h.replace(services...)
	return h
}

func (h *harness) replace(services ...lb.Service) {
	h.t.Helper()
	snap, err := h.store.Replace(services)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.fwd.Apply(context.Background(), snap); err != nil {
		h.t.Fatal(err)
	}
}

// settle waits until the forwarder has finished every connection: it counts
// and logs a connection when its own side is done, after the client's.
func (h *harness) settle() {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for h.fwd.Active() != 0 {
		if time.Now().After(deadline) {
			h.t.Fatalf("%d connections still open", h.fwd.Active())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// connectionLoad opens connection after connection to fe from four
// goroutines, each given 3 s for exchange, until stop is called; stop
// returns how many connections ran and how many failed (to connect or in
// exchange).
func connectionLoad(fe netip.AddrPort, exchange func(c net.Conn) error) (stop func() (done, failed int64)) {
	var failures, count atomic.Int64
	quit := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-quit:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", fe.String(), 2*time.Second)
				if err == nil {
					_ = c.SetDeadline(time.Now().Add(3 * time.Second))
					err = exchange(c)
					c.Close()
				}
				if err != nil {
					failures.Add(1)
				}
				count.Add(1)
			}
		}()
	}
	return func() (int64, int64) {
		close(quit)
		wg.Wait()
		return count.Load(), failures.Load()
	}
}

// waitFor polls cond until it holds or 5s pass.
// copyPlain copies as io.Copy does, through a buffer and never by splice:
// Go's splice borrows pipes from a pool whose idle pipes the collector
// closes when it likes, which would free descriptors in the middle of a
// test that has taken them all (TestOutOfDescriptors).
func copyPlain(dst io.Writer, src io.Reader) (int64, error) {
	return io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, make([]byte, 64<<10))
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not so after 5s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func dial(t testing.TB, addr netip.AddrPort) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr.String(), 5*time.Second)
	if err != nil {
		t.Fatalf("dialing %v: %v", addr, err)
	}
	return c.(*net.TCPConn)
}

// askName connects through the proxy and returns the backend's name.
func askName(t testing.TB, addr netip.AddrPort) string {
	t.Helper()
	c := dial(t, addr)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("reading backend name through %v: %v", addr, err)
	}
	return strings.TrimSpace(line)
}

// expectReset connects to addr and expects a reset, which may arrive
// before or after connect(2) returns.
func expectReset(t testing.TB, addr netip.AddrPort) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr.String(), 5*time.Second)
	if err == nil {
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
	}
	if !isReset(err) {
		t.Fatalf("connecting to %v: %v, want a reset", addr, err)
	}
}

// isReset reports whether err is a connection reset by the peer.
func isReset(err error) bool {
	return err != nil && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE))
}

// leakCheck records goroutines and open FDs and, at cleanup, waits for them
// to return to that level.
func leakCheck(t *testing.T) {
	t.Helper()
	g0, fd0 := runtime.NumGoroutine(), openFDs(t)
	t.Cleanup(func() {
		deadline := time.Now().Add(10 * time.Second)
		for {
			g, fd := runtime.NumGoroutine(), openFDs(t)
			if g <= g0 && fd <= fd0 {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				n := runtime.Stack(buf, true)
				t.Fatalf("leak: goroutines %d → %d, fds %d → %d\n%s", g0, g, fd0, fd, buf[:n])
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}
