package forwarder

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/lb"
)

// TestUDPPortsPreferred: with steering, a UDP frontend's socket takes the
// port Config.UDPPorts gives it (what a previous process's rules still
// redirect to) when that port is free, and another one when it is not.
func TestUDPPortsPreferred(t *testing.T) {
	for _, taken := range []bool{false, true} {
		name := "free"
		if taken {
			name = "taken"
		}
		t.Run(name, func(t *testing.T) {
			leakCheck(t)
			e := startUDPEcho(t, "dns")
			frontend := netip.MustParseAddrPort("198.18.255.1:53")
			snap, err := lb.NewStore(lb.StoreOptions{}).Replace([]lb.Service{udpService("dns", frontend, e.addr)})
			if err != nil {
				t.Fatal(err)
			}
			want := freeUDPFrontend(t).Port()
			if taken {
				hold, err := net.ListenUDP("udp4", &net.UDPAddr{Port: int(want)})
				if err != nil {
					t.Fatal(err)
				}
				defer hold.Close()
			}
			fe := lb.Frontend{Protocol: lb.UDP, Addr: frontend}
			f, err := New(Config{Engine: testEngine, Redirect: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:0")}, Mark: -1, Workers: 1,
				UDPPorts: map[lb.Frontend]uint16{fe: want}, Logger: zaptest.NewLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer shutdown(f)
			if err := f.Apply(context.Background(), snap); err != nil {
				t.Fatal(err)
			}
			got := f.UDPPorts()[fe]
			switch {
			case got == 0:
				t.Fatalf("no socket for %v", fe)
			case !taken && got != want:
				t.Errorf("socket on port %d, want the preferred %d", got, want)
			case taken && got == want:
				t.Errorf("socket on the taken port %d", got)
			}
			c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), got)))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if reply, err := ask(c, []byte("q")); err != nil || string(reply) != "dns q" {
				t.Errorf("through the socket: %q, %v; want %q", reply, err, "dns q")
			}
		})
	}
}

// TestUDPRedirectRepliesFromAddressUsed: with steering, a UDP frontend's
// socket is bound to 0.0.0.0, and each reply leaves from the address its
// client's datagram arrived at (after REDIRECT, 127.0.0.1 for a client on
// the node), as conntrack needs to turn it back into the Service's: a
// client connected to 127.0.0.3 takes only replies from 127.0.0.3, where
// the kernel, left to choose, answers from 127.0.0.1.
func TestUDPRedirectRepliesFromAddressUsed(t *testing.T) {
	leakCheck(t)
	e := startUDPEcho(t, "dns")
	frontend := netip.MustParseAddrPort("198.18.255.1:53")
	snap, err := lb.NewStore(lb.StoreOptions{}).Replace([]lb.Service{udpService("dns", frontend, e.addr)})
	if err != nil {
		t.Fatal(err)
	}
	f, err := New(Config{Engine: testEngine, Redirect: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:0")}, Mark: -1, Workers: 1, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(f)
	if err := f.Apply(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	port := f.UDPPorts()[lb.Frontend{Protocol: lb.UDP, Addr: frontend}]
	if port == 0 {
		t.Fatal("no socket for the frontend")
	}
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), port)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if reply, err := ask(c, []byte("q")); err != nil || string(reply) != "dns q" {
		t.Errorf("from 127.0.0.1 to 127.0.0.3: %q, %v; want %q from 127.0.0.3", reply, err, "dns q")
	}
}
