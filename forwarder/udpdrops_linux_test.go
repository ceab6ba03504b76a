package forwarder

import (
	"net"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/lb"
)

// TestUDPReceiveDrops: datagrams the kernel drops at a full frontend socket
// are counted in svcproxy_forwarder_udp_receive_drops_total{socket=
// "frontend"} when the metrics are gathered, and UDPReceiveBuffer sizes
// the frontend's receive buffer.
func TestUDPReceiveDrops(t *testing.T) {
	for _, tc := range []struct {
		name   string
		buffer int
		burst  int
		drops  bool
	}{
		{name: "small buffer overflows", buffer: 4096, burst: 400, drops: true},
		{name: "large buffer holds the burst", buffer: 4 << 20, burst: 400, drops: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leakCheck(t)
			reg := prometheus.NewPedanticRegistry()
			m := NewMetrics(reg)
			fe := freeUDPFrontend(t)
			be := startUDPEcho(t, "a")
			h := newHarness(t, Config{Metrics: m, UDPReceiveBuffer: tc.buffer}, udpService("dns", fe, be.addr))
			h.fwd.mu.Lock()
			front := h.fwd.udp[lb.Frontend{Protocol: lb.UDP, Addr: fe}]
			h.fwd.mu.Unlock()
			if front == nil {
				t.Fatalf("no UDP frontend socket for %v", fe)
			}
			file, err := front.file()
			if err != nil {
				t.Fatal(err)
			}
			var got int
			if raw, err := file.SyscallConn(); err == nil { // not Fd(): it would make the shared socket blocking
				_ = raw.Control(func(fd uintptr) { got, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF) })
			}
			file.Close()
			if got < tc.buffer { // the kernel doubles what it is given
				t.Errorf("SO_RCVBUF = %d, want at least %d", got, tc.buffer)
			}

			// Stall the frontend's reader, so the burst queues in the
			// socket's buffer.
			c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(fe))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			release := stallUDP(t, front)
			payload := make([]byte, 1000)
			for range tc.burst {
				if _, err := c.Write(payload); err != nil {
					release()
					t.Fatal(err)
				}
			}
			release()

			count := func() float64 {
				t.Helper()
				mfs, err := reg.Gather()
				if err != nil {
					t.Fatal(err)
				}
				for _, mf := range mfs {
					if mf.GetName() != "svcproxy_forwarder_udp_receive_drops_total" {
						continue
					}
					for _, mm := range mf.GetMetric() {
						if mm.GetLabel()[0].GetValue() == "frontend" {
							return mm.GetCounter().GetValue()
						}
					}
				}
				return 0
			}
			drops := count()
			if tc.drops && drops == 0 {
				t.Fatalf("%d datagrams of 1000 bytes into a %d-byte buffer with the reader stalled: no drop counted", tc.burst, got)
			}
			if !tc.drops && drops != 0 {
				t.Fatalf("%v drops counted with a %d-byte buffer", drops, got)
			}
			if again := count(); again != drops {
				t.Errorf("gathering again changed the count from %v to %v with no new drops", drops, again)
			}
		})
	}
}

// stallUDP stops s from reading until release is called: the goroutine
// path's reader takes its frontend's lock for each new flow, so it stops
// after the first datagram; the event loop's worker is held in a task.
func stallUDP(t *testing.T, s udpSocket) (release func()) {
	switch s := s.(type) {
	case *udpFrontend:
		s.mu.Lock()
		return s.mu.Unlock
	case *loopUDP:
		held, free := make(chan struct{}), make(chan struct{})
		s.w.post(func(*worker) { close(held); <-free })
		<-held
		return func() { close(free) }
	}
	t.Fatalf("cannot stall a %T", s)
	return nil
}
