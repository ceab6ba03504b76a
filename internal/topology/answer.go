package topology

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ServeNames serves TCP and UDP on :8080 in h (IPv4) until the test ends,
// answering each connection or datagram with "<h.Name> <peer address>":
// who answered, and the source it saw.
func ServeNames(t testing.TB, h *Host) {
	ctx := context.Background()
	ln, err := h.Listen(ctx, "tcp4", ":8080")
	if err != nil {
		t.Fatal(err)
	}
	pc, err := h.ListenPacket(ctx, "udp4", ":8080")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close(); pc.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s %s\n", h.Name, c.RemoteAddr())
			c.Close()
		}
	}()
	go func() {
		buf := make([]byte, 1500)
		for {
			_, src, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(fmt.Appendf(nil, "%s %s\n", h.Name, src), src)
		}
	}()
}

// Ask connects from h to addr ("tcp4" or "udp4") and returns which
// ServeNames host answered and the peer address it saw.
func Ask(h *Host, network, addr string, timeout time.Duration) (name, peer string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := h.Dial(ctx, network, addr)
	if err != nil {
		return "", "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if network == "udp4" {
		if _, err := c.Write([]byte("hello")); err != nil {
			return "", "", err
		}
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", "", err
	}
	f := strings.Fields(line)
	if len(f) != 2 {
		return "", "", fmt.Errorf("bad answer %q", line)
	}
	host, _, _ := net.SplitHostPort(f[1])
	return f[0], host, nil
}

// Spread asks dst from h 40 times (Ask): every answer must come from one
// of backends, every one of them must answer at least once, and each must
// have seen the source peer(its name) returns.
func Spread(t testing.TB, h *Host, network, dst string, backends []string, peer func(name string) string) {
	t.Helper()
	seen := map[string]int{}
	for range 40 {
		name, saw, err := Ask(h, network, dst, 2*time.Second)
		if err != nil {
			t.Fatalf("after %v: %v", seen, err)
		}
		seen[name]++
		if want := peer(name); saw != want {
			t.Errorf("%s saw the connection from %s, want %s", name, saw, want)
		}
		if !slices.Contains(backends, name) {
			t.Errorf("answered by %s, want one of %v", name, backends)
		}
	}
	for _, b := range backends {
		if seen[b] == 0 {
			t.Errorf("%s never answered (%v): traffic must spread over all endpoints", b, seen)
		}
	}
}

// Refused asks dst from h and expects a refusal (a TCP reset or an ICMP
// port unreachable) within 500 ms.
func Refused(t testing.TB, h *Host, network, dst string) {
	t.Helper()
	start := time.Now()
	_, _, err := Ask(h, network, dst, 2*time.Second)
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("refused after %v, want at once", took)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("error %v, want connection refused", err)
	}
}

// SamePorts asks tcpDst and udpDst from h, each from one fixed client port
// (a SYN retransmitted, a resolver that keeps its port): first before
// serve, when neither may answer, then after it, when both must, from the
// ServeNames host named backend. It is what conntrack entries of the
// unanswered packets must not get in the way of.
func SamePorts(t testing.TB, h *Host, tcpDst, udpDst netip.AddrPort, backend string, serve func()) {
	t.Helper()
	const tcpPort, udpPort = 42000, 42053
	var uc *net.UDPConn
	if err := h.Do(func() (err error) { uc, err = net.ListenUDP("udp4", &net.UDPAddr{Port: udpPort}); return err }); err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	askTCP := func(timeout time.Duration) (string, error) {
		var c net.Conn
		err := h.Do(func() (err error) {
			d := net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{Port: tcpPort}}
			c, err = d.Dial("tcp4", tcpDst.String())
			return err
		})
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(timeout))
		return bufio.NewReader(c).ReadString('\n')
	}
	askUDP := func(timeout time.Duration) (string, error) {
		if _, err := uc.WriteToUDPAddrPort([]byte("hello"), udpDst); err != nil {
			return "", err
		}
		uc.SetReadDeadline(time.Now().Add(timeout))
		buf := make([]byte, 200)
		n, _, err := uc.ReadFromUDPAddrPort(buf)
		return string(buf[:n]), err
	}
	if got, err := askTCP(500 * time.Millisecond); err == nil {
		t.Fatalf("TCP to %v answered %q before it was served", tcpDst, got)
	}
	if got, err := askUDP(300 * time.Millisecond); err == nil {
		t.Fatalf("UDP to %v answered %q before it was served", udpDst, got)
	}
	serve()
	if got, err := askTCP(2 * time.Second); err != nil || !strings.HasPrefix(got, backend+" ") {
		t.Errorf("TCP to %v from the same client port once served: %q, %v; want %s's answer", tcpDst, got, err, backend)
	}
	var got string
	var err error
	for range 4 { // a datagram may be lost; the port stays the same
		if got, err = askUDP(500 * time.Millisecond); err == nil {
			break
		}
	}
	if err != nil || !strings.HasPrefix(got, backend+" ") {
		t.Errorf("UDP to %v from the same client port once served: %q, %v; want %s's answer", udpDst, got, err, backend)
	}
}
