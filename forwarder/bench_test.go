package forwarder

import (
	"bufio"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/lb"
)

// BenchmarkThroughput streams through the proxy to a sink backend, one
// connection, 64 MiB per op. Compare with BenchmarkThroughput/direct.
func BenchmarkThroughput(b *testing.B) {
	sink := startBackend(b, "sink", modeSink)
	for _, tc := range benchTargets(b, sink.addr, func(fe netip.AddrPort) lb.Service { return service("bulk", fe, sink.addr) }) {
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
	for _, tc := range benchTargets(b, echo.addr, func(fe netip.AddrPort) lb.Service { return service("conn", fe, echo.addr) }) {
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
	for _, tc := range benchTargets(b, echo.addr, func(fe netip.AddrPort) lb.Service { return service("rr", fe, echo.addr) }) {
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

type benchTarget struct {
	name string
	addr netip.AddrPort
}

// benchTargets are the backend itself ("direct") and the Service svc
// makes for a frontend, through a forwarder on each TCP engine this
// platform builds.
func benchTargets(b *testing.B, direct netip.AddrPort, svc func(fe netip.AddrPort) lb.Service) []benchTarget {
	out := []benchTarget{{"direct", direct}}
	engines := []Engine{EngineGoroutines}
	if defaultEngine == EngineEventLoop {
		engines = append(engines, EngineEventLoop)
	}
	for _, e := range engines {
		fe := freeFrontend(b)
		newHarness(b, Config{Engine: e, Logger: zap.NewNop()}, svc(fe))
		out = append(out, benchTarget{"proxy/" + string(e), fe})
	}
	if off := benchOffloader(b); off != nil {
		fe := freeFrontend(b)
		newHarness(b, Config{Engine: EngineEventLoop, Offload: OffloadSockmap, Offloader: off, Logger: zap.NewNop()}, svc(fe))
		out = append(out, benchTarget{"proxy/eventloop+sockmap", fe})
	}
	return out
}
