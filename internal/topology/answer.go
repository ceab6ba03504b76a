package topology

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
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
