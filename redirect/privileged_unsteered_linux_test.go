package redirect

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/internal/kerneltest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// TestPrivilegedUnsteeredFlows is TestClearUnsteered against the kernel: a
// client's SYN and a datagram reach a Service IP before the Service is
// steered, and go nowhere; conntrack keeps their entries, unsteered. Once
// the Service is steered, the client tries again from the same ports (a
// SYN retransmitted, a resolver that keeps its port): both must reach the
// forwarder's sockets, not follow the old entries.
func TestPrivilegedUnsteeredFlows(t *testing.T) {
	privileged.Require(t)
	for _, backend := range []Backend{BackendIPTables, BackendNFTables} {
		t.Run(string(backend), func(t *testing.T) { testUnsteeredFlows(t, backend) })
	}
}

func testUnsteeredFlows(t *testing.T, backend Backend) {
	ctx := context.Background()
	top := newTopology(t)
	const udpPort = 40053
	const clientTCPPort, clientUDPPort = 41000, 41053
	vip, dnsVIP := ap("198.18.10.1:80"), ap("198.18.10.53:53")

	var ln net.Listener
	var udp *net.UDPConn
	kerneltest.Do(t, top.node, func() {
		var err error
		if ln, err = net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", testTCPPort)); err != nil {
			t.Fatal(err)
		}
		if udp, err = net.ListenUDP("udp4", &net.UDPAddr{Port: udpPort}); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { ln.Close(); udp.Close() })
	pktinfoServer(t, udp)
	accepted := acceptRedirected(t, ln)

	r, err := New(Config{Backend: backend, NetNS: top.node, Mark: testMark, Exec: &netfilter.Exec{NetNS: top.node}, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Cleanup(ctx); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
	})
	// Another Service only: the steering (and so conntrack) is on, web and
	// dns are not steered yet.
	other := lb.Service{Name: svcName("other"), Port: 80, Endpoints: eps(1, ""), ClusterIPs: []netip.Addr{ip("198.18.10.9")}}
	web := lb.Service{Name: svcName("web"), Port: 80, Endpoints: eps(1, ""), ClusterIPs: []netip.Addr{vip.Addr()}}
	dns := lb.Service{Name: svcName("dns"), Protocol: lb.UDP, Port: 53, Endpoints: eps(1, ""), ClusterIPs: []netip.Addr{dnsVIP.Addr()}}
	ports := Ports{TCP: testTCPPort, UDP: map[lb.Frontend]uint16{{Protocol: lb.UDP, Addr: dnsVIP}: udpPort}}
	s := store(t, other)
	mustApply(t, r, s.Snapshot(), ports, true)

	dial := func(timeout time.Duration) (net.Conn, error) {
		var c net.Conn
		var err error
		d := net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{Port: clientTCPPort}}
		kerneltest.Do(t, top.client, func() { c, err = d.Dial("tcp4", vip.String()) })
		return c, err
	}
	var uc *net.UDPConn
	kerneltest.Do(t, top.client, func() {
		if uc, err = net.ListenUDP("udp4", &net.UDPAddr{Port: clientUDPPort}); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { uc.Close() })

	// Before: the SYN and the datagram go out of the node toward nobody.
	if c, err := dial(300 * time.Millisecond); err == nil {
		c.Close()
		t.Fatal("a connection to the Service IP before it was steered succeeded")
	}
	if reply, err := udpAsk(t, "", uc, dnsVIP, "before"); err == nil {
		t.Fatalf("a datagram to the Service IP before it was steered got %q", reply)
	}

	// Steered now: the same client ports must reach the forwarder.
	if _, err := s.Update([]lb.Service{web, dns}, nil); err != nil {
		t.Fatal(err)
	}
	mustApply(t, r, s.Snapshot(), ports, false)
	c, err := dial(2 * time.Second)
	if err != nil {
		t.Fatalf("from the same client port after the Service was steered: %v", err)
	}
	c.Close()
	select {
	case got := <-accepted:
		if got != vip {
			t.Errorf("SO_ORIGINAL_DST = %v, want %v", got, vip)
		}
	case <-time.After(2 * time.Second):
		t.Error("the redirect listener got nothing")
	}
	if reply, err := udpAsk(t, "", uc, dnsVIP, "after"); err != nil || reply != "pong:after" {
		t.Errorf("a datagram from the same client port after the Service was steered: %q, %v", reply, err)
	}
}
