package forwarder

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/svcproxy/svcproxy/lb"
)

// udpEcho is a UDP backend answering "name " + datagram; datagrams of
// 60 KiB or more are echoed as they are, to fit the 64 KiB limit.
type udpEcho struct {
	name string
	pc   *net.UDPConn
	addr netip.AddrPort
	wg   sync.WaitGroup
}

func startUDPEcho(t testing.TB, name string) *udpEcho {
	t.Helper()
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	e := &udpEcho{name: name, pc: pc, addr: pc.LocalAddr().(*net.UDPAddr).AddrPort()}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		buf := make([]byte, 1<<16)
		for {
			n, from, err := pc.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			reply := append([]byte(name+" "), buf[:n]...)
			if n >= 60<<10 {
				reply = buf[:n]
			}
			_, _ = pc.WriteToUDPAddrPort(reply, from)
		}
	}()
	t.Cleanup(func() { pc.Close(); e.wg.Wait() })
	return e
}

func udpService(name string, frontend netip.AddrPort, addrs ...netip.AddrPort) lb.Service {
	svc := service(name, frontend, addrs...)
	svc.Protocol = lb.UDP
	return svc
}

// freeUDPFrontend returns a loopback UDP address nothing listens on.
func freeUDPFrontend(t testing.TB) netip.AddrPort {
	t.Helper()
	return freePort(t, "udp4", loopback4)
}

// query sends msg from a new connected socket to addr and returns the
// reply, retrying on timeout as a resolver would.
func query(t testing.TB, addr netip.AddrPort, msg []byte) ([]byte, error) {
	t.Helper()
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return ask(c, msg)
}

// ask sends msg on c and returns the reply, retrying on timeout.
func ask(c *net.UDPConn, msg []byte) ([]byte, error) {
	buf := make([]byte, 1<<16)
	var lastErr error
	for try := 0; try < 5; try++ {
		if _, err := c.Write(msg); err != nil {
			lastErr = err
			continue
		}
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		n, err := c.Read(buf)
		if err == nil {
			return buf[:n], nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func TestUDPFlows(t *testing.T) {
	leakCheck(t)
	fe := freeUDPFrontend(t)
	a, b := startUDPEcho(t, "a"), startUDPEcho(t, "b")
	h := newHarness(t, Config{}, udpService("dns", fe, a.addr, b.addr))
	got := map[string]int{}
	for i := 0; i < 200; i++ {
		// Each query from its own socket, kept open so the kernel does
		// not reuse its port (and so its flow) for the next.
		c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(fe))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		reply, err := ask(c, []byte("q"))
		if err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
		name, rest, _ := strings.Cut(string(reply), " ")
		if rest != "q" {
			t.Fatalf("reply %q", reply)
		}
		got[name]++
	}
	if got["a"] != 100 || got["b"] != 100 {
		t.Errorf("flows per backend = %v, want 100 each (round robin over new flows)", got)
	}
	if n := testutil.ToFloat64(h.m.udpFlowsOK); n != 200 {
		t.Errorf("flows opened = %v, want 200", n)
	}
}

func TestUDPSameFlowSameBackend(t *testing.T) {
	leakCheck(t)
	fe := freeUDPFrontend(t)
	a, b := startUDPEcho(t, "a"), startUDPEcho(t, "b")
	newHarness(t, Config{}, udpService("dns", fe, a.addr, b.addr))
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(fe))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	first := ""
	buf := make([]byte, 100)
	for i := 0; i < 20; i++ {
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := c.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		name, _, _ := strings.Cut(string(buf[:n]), " ")
		if first == "" {
			first = name
		} else if name != first {
			t.Fatalf("datagram %d of one flow went to %s, first went to %s", i, name, first)
		}
	}
}

func TestUDPLargeDatagramsNotTruncated(t *testing.T) {
	leakCheck(t)
	fe := freeUDPFrontend(t)
	e := startUDPEcho(t, "big")
	newHarness(t, Config{}, udpService("big", fe, e.addr))
	for _, size := range []int{1, 1400, 9000, 65507} {
		msg := make([]byte, size)
		rand.NewChaCha8([32]byte{byte(size)}).Read(msg)
		reply, err := query(t, fe, msg)
		if err != nil {
			t.Fatalf("%d-byte datagram: %v", size, err)
		}
		want := msg
		if size < 60<<10 {
			want = append([]byte("big "), msg...)
		}
		if !bytes.Equal(reply, want) {
			t.Fatalf("%d-byte datagram: got %d bytes back, want %d", size, len(reply), len(want))
		}
	}
}

func TestUDPBackendDownIsAvoided(t *testing.T) {
	leakCheck(t)
	fe := freeUDPFrontend(t)
	live := startUDPEcho(t, "live")
	dead := freeUDPFrontend(t) // nothing listens: ICMP port unreachable
	h := newHarness(t, Config{}, udpService("dns", fe, live.addr, dead))
	for i := 0; i < 100; i++ {
		reply, err := query(t, fe, []byte("q"))
		if err != nil {
			t.Fatalf("query %d not answered: %v", i, err)
		}
		if !strings.HasPrefix(string(reply), "live ") {
			t.Fatalf("reply %q", reply)
		}
	}
	if n := testutil.ToFloat64(h.m.dialRefused); n < 1 || n > 5 {
		t.Errorf("port-unreachable backend marked failed %v times; want 1 to 5 (then it cools down)", n)
	}
}

func TestUDPIdleFlowsExpire(t *testing.T) {
	leakCheck(t)
	fe := freeUDPFrontend(t)
	e := startUDPEcho(t, "a")
	h := newHarness(t, Config{UDPIdleTimeout: 200 * time.Millisecond}, udpService("dns", fe, e.addr))
	for i := 0; i < 10; i++ {
		c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(fe))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close() // open, so no port (and flow) is reused
		if _, err := ask(c, []byte("q")); err != nil {
			t.Fatal(err)
		}
	}
	if n := testutil.ToFloat64(h.m.activeUDP); n != 10 {
		t.Fatalf("active flows = %v, want 10", n)
	}
	deadline := time.Now().Add(3 * time.Second)
	for testutil.ToFloat64(h.m.activeUDP) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("flows still active %v after 3s with a 200ms idle timeout", testutil.ToFloat64(h.m.activeUDP))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := testutil.ToFloat64(h.m.closes[reasonIdle]); n != 10 {
		t.Errorf("idle closes = %v, want 10", n)
	}
}

func TestUDPAffinityAcrossFlows(t *testing.T) {
	leakCheck(t)
	fe := freeUDPFrontend(t)
	a, b := startUDPEcho(t, "a"), startUDPEcho(t, "b")
	svc := udpService("sticky", fe, a.addr, b.addr)
	svc.AffinityTimeout = time.Minute
	newHarness(t, Config{}, svc)
	first := ""
	for i := 0; i < 20; i++ {
		reply, err := query(t, fe, []byte("q"))
		if err != nil {
			t.Fatal(err)
		}
		name, _, _ := strings.Cut(string(reply), " ")
		if first == "" {
			first = name
		} else if name != first {
			t.Fatalf("flow %d from the same client IP went to %s, not %s", i, name, first)
		}
	}
}

func TestUDPNodePortRepliesFromAddressUsed(t *testing.T) {
	leakCheck(t)
	port := freeUDPFrontend(t).Port()
	e := startUDPEcho(t, "np")
	svc := udpService("np", netip.AddrPortFrom(netip.MustParseAddr("198.18.255.1"), 53), e.addr)
	svc.ClusterIPs = nil
	svc.NodePort = port
	newHarness(t, Config{}, svc)
	// The NodePort socket is bound to 0.0.0.0; a connected client socket
	// accepts only replies from the exact address it wrote to.
	for _, ip := range []string{"127.0.0.1", "127.0.0.2", "127.1.2.3"} {
		reply, err := query(t, netip.AddrPortFrom(netip.MustParseAddr(ip), port), []byte("q"))
		if err != nil {
			t.Fatalf("NodePort via %s: %v", ip, err)
		}
		if string(reply) != "np q" {
			t.Fatalf("NodePort via %s: reply %q", ip, reply)
		}
	}
}

func TestUDPFlowsToRemovedBackendEnd(t *testing.T) {
	leakCheck(t)
	fe := freeUDPFrontend(t)
	a, b := startUDPEcho(t, "a"), startUDPEcho(t, "b")
	h := newHarness(t, Config{}, udpService("dns", fe, a.addr, b.addr))
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(fe))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ask := func() string {
		t.Helper()
		buf := make([]byte, 100)
		for try := 0; try < 5; try++ {
			_, _ = c.Write([]byte("x"))
			_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			if n, err := c.Read(buf); err == nil {
				name, _, _ := strings.Cut(string(buf[:n]), " ")
				return name
			} else if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal(err)
			}
		}
		t.Fatal("no reply")
		return ""
	}
	first := ask()
	keep := b.addr
	if first == "b" {
		keep = a.addr
	}
	h.replace(udpService("dns", fe, keep))
	if now := ask(); now == first {
		t.Fatalf("the flow stayed on removed backend %s", first)
	}
}

// TestUDPBackendRemovedWhileRouting: a snapshot that removes the backend
// lands after a new flow was routed to it but before the flow joined its
// frontend's table (so Apply's drop did not see it). The flow is dropped
// all the same, and its datagram goes to the backend that is left.
func TestUDPBackendRemovedWhileRouting(t *testing.T) {
	if testEngine != EngineGoroutines {
		t.Skip("the event loop routes flows and drops stale ones on one goroutine: nothing races")
	}
	leakCheck(t)
	fe := freeUDPFrontend(t)
	a, b := startUDPEcho(t, "a"), startUDPEcho(t, "b")
	h := newHarness(t, Config{}, udpService("dns", fe, a.addr))
	hook := func() {
		testHookUDPRouted.Store(nil)
		h.replace(udpService("dns", fe, b.addr))
	}
	testHookUDPRouted.Store(&hook)
	defer testHookUDPRouted.Store(nil)
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(fe))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 3 {
		reply, err := ask(c, []byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		if name, _, _ := strings.Cut(string(reply), " "); name != "b" {
			t.Fatalf("datagram %d answered by %q, want b (a left while its flow was being routed)", i, name)
		}
	}
}

// TestUDPBurstsKeepOrder: clients that send bursts without waiting (so a
// frontend read holds several datagrams of one flow, written to the
// backend together) get every datagram through, each flow in order, and
// every one counted.
func TestUDPBurstsKeepOrder(t *testing.T) {
	leakCheck(t)
	fe := freeUDPFrontend(t)
	a := startUDPEcho(t, "a")
	h := newHarness(t, Config{}, udpService("dns", fe, a.addr))
	const clients, burst = 4, 64
	var conns []*net.UDPConn
	for range clients {
		c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(fe))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	for i := range burst { // interleaved: each read of the frontend holds several flows
		for k, c := range conns {
			if _, err := fmt.Fprintf(c, "%d-%d", k, i); err != nil {
				t.Fatal(err)
			}
		}
	}
	expectReplies(t, conns, burst, func(k, i int) string { return fmt.Sprintf("a %d-%d", k, i) })
	if n := testutil.ToFloat64(h.m.udpIn); n != clients*burst {
		t.Errorf("datagrams forwarded = %v, want %d", n, clients*burst)
	}
}

// Two frontends served by one worker, their clients' datagrams interleaved
// and the backend holding every answer until it has all the queries: the
// replies reach the worker together, from the flows of both frontends, and
// each must go out of the socket its client wrote to (a connected client
// socket drops anything else), in order.
func TestUDPFrontendsShareAWorker(t *testing.T) {
	leakCheck(t)
	fe1, fe2 := freeUDPFrontend(t), freeUDPFrontend(t)
	const clients, burst = 6, 5 // a flow's replies fill part of a batch: the next flow's join them
	be := startUDPGather(t, clients*burst)
	h := newHarness(t, Config{Workers: 1}, udpService("one", fe1, be), udpService("two", fe2, be))
	var conns []*net.UDPConn
	for k := range clients {
		fe := fe1
		if k%2 == 1 {
			fe = fe2
		}
		c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(fe))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	for i := range burst {
		for k, c := range conns {
			if _, err := fmt.Fprintf(c, "%d-%d", k, i); err != nil {
				t.Fatal(err)
			}
		}
	}
	expectReplies(t, conns, burst, func(k, i int) string { return fmt.Sprintf("%d-%d", k, i) })
	// Counted once the send returns, which can be after the client has
	// the reply.
	waitFor(t, fmt.Sprintf("%d replies counted as sent", clients*burst), func() bool {
		return testutil.ToFloat64(h.m.udpOut) == clients*burst
	})
}

// expectReplies reads burst replies on each of conns and checks that reply
// i on conn k is want(k, i): every datagram, in order.
func expectReplies(t *testing.T, conns []*net.UDPConn, burst int, want func(k, i int) string) {
	t.Helper()
	buf := make([]byte, 100)
	for k, c := range conns {
		for i := range burst {
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := c.Read(buf)
			if err != nil {
				t.Fatalf("client %d, reply %d: %v", k, i, err)
			}
			if got, w := string(buf[:n]), want(k, i); got != w {
				t.Fatalf("client %d: reply %q, want %q (every datagram, in order)", k, got, w)
			}
		}
	}
}

// startUDPGather starts a UDP backend that reads n datagrams and then
// echoes them all back, in the order they came.
func startUDPGather(t testing.TB, n int) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.SetReadBuffer(4 << 20); err != nil {
		t.Fatal(err)
	}
	type dgram struct {
		b    []byte
		from netip.AddrPort
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var got []dgram
		buf := make([]byte, 1<<16)
		for len(got) < n {
			k, from, err := pc.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			got = append(got, dgram{bytes.Clone(buf[:k]), from})
		}
		for _, d := range got {
			_, _ = pc.WriteToUDPAddrPort(d.b, d.from)
		}
	}()
	t.Cleanup(func() { pc.Close(); wg.Wait() })
	return pc.LocalAddr().(*net.UDPAddr).AddrPort()
}

// TestDropMeter: a socket's cumulative drop count becomes counter
// increments; a count read before one already taken (two readers racing)
// adds nothing, and the count wrapping past 2^32 adds what it moved.
func TestDropMeter(t *testing.T) {
	for _, tc := range []struct {
		name   string
		start  uint32
		counts []uint32
		want   float64
	}{
		{"rising", 0, []uint32{0, 5, 6, 9}, 9},
		{"an older count after a newer one", 0, []uint32{5, 6, 5, 7}, 7},
		{"past 2^32", 0xfffffffe, []uint32{0xffffffff, 1}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := prometheus.NewCounter(prometheus.CounterOpts{Name: "drops"})
			d := dropMeter{seen: tc.start}
			for _, n := range tc.counts {
				d.add(n, c)
			}
			if got := testutil.ToFloat64(c); got != tc.want {
				t.Errorf("counted %v, want %v", got, tc.want)
			}
		})
	}
}
