package forwarder

import (
	"bufio"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"go.uber.org/zap"
)

// BenchmarkThroughput streams through the proxy to a sink backend, one
// connection, 64 MiB per op. Compare with BenchmarkThroughput/direct.
func BenchmarkThroughput(b *testing.B) {
	sink := startBackend(b, "sink", modeSink)
	fe := freeFrontend(b)
	newHarness(b, Config{Logger: zap.NewNop()}, service("bulk", fe, sink.addr))
	for _, tc := range []struct {
		name string
		addr netip.AddrPort
	}{{"direct", sink.addr}, {"proxy", fe}} {
		b.Run(tc.name, func(b *testing.B) {
			const chunk = 1 << 20
			buf := make([]byte, chunk)
			c := dial(b, tc.addr)
			defer c.Close()
			b.SetBytes(64 * chunk)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := 0; j < 64; j++ {
					if _, err := c.Write(buf); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// BenchmarkConnect measures new connections per second: connect, one
// request line, its echo, close.
func BenchmarkConnect(b *testing.B) {
	echo := startBackend(b, "echo", modeEcho)
	fe := freeFrontend(b)
	newHarness(b, Config{Logger: zap.NewNop()}, service("conn", fe, echo.addr))
	for _, tc := range []struct {
		name string
		addr netip.AddrPort
	}{{"direct", echo.addr}, {"proxy", fe}} {
		b.Run(tc.name, func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				msg := []byte("ping\n")
				for pb.Next() {
					c, err := net.DialTimeout("tcp", tc.addr.String(), 5*time.Second)
					if err != nil {
						b.Error(err)
						return
					}
					if _, err := c.Write(msg); err != nil {
						b.Error(err)
					}
					if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
						b.Error(err)
					}
					c.(*net.TCPConn).SetLinger(0) // no TIME_WAIT pile-up on the client side
					c.Close()
				}
			})
		})
	}
}

// BenchmarkRequest measures keep-alive request/response round trips of
// 1 KiB over 8 connections.
func BenchmarkRequest(b *testing.B) {
	echo := startBackend(b, "echo", modeEcho)
	fe := freeFrontend(b)
	newHarness(b, Config{Logger: zap.NewNop()}, service("rr", fe, echo.addr))
	for _, tc := range []struct {
		name string
		addr netip.AddrPort
	}{{"direct", echo.addr}, {"proxy", fe}} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetParallelism(4)
			b.RunParallel(func(pb *testing.PB) {
				c := dial(b, tc.addr)
				defer c.Close()
				req := make([]byte, 1024)
				resp := make([]byte, 1024)
				for pb.Next() {
					if _, err := c.Write(req); err != nil {
						b.Error(err)
						return
					}
					if _, err := io.ReadFull(c, resp); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
