package forwarder

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/lb"
)

// dnsFrontend is the UDP frontend of redirectedDNS's Service.
var dnsFrontend = lb.Frontend{Protocol: lb.UDP, Addr: netip.MustParseAddrPort("198.18.255.1:53")}

// redirectedDNS starts a forwarder with steering (Redirect) serving one UDP
// Service on dnsFrontend, whose backend answers "dns " + each datagram,
// with ports as Config.UDPPorts; it returns the port of the frontend's
// socket (0: none).
func redirectedDNS(t *testing.T, ports map[lb.Frontend]uint16) uint16 {
	t.Helper()
	e := startUDPEcho(t, "dns")
	snap, err := lb.NewStore(lb.StoreOptions{}).Replace([]lb.Service{udpService("dns", dnsFrontend.Addr, e.addr)})
	if err != nil {
		t.Fatal(err)
	}
	f, err := New(Config{Engine: testEngine, Redirect: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:0")}, Mark: -1, Workers: 1,
		UDPPorts: ports, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(f) })
	if err := f.Apply(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	return f.UDPPorts()[dnsFrontend]
}

// askDNS sends "q" from a socket connected to ip:port and reports an error
// unless "dns q" comes back.
func askDNS(t *testing.T, ip string, port uint16) error {
	t.Helper()
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(ip), port)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	reply, err := ask(c, []byte("q"))
	if err == nil && string(reply) != "dns q" {
		t.Errorf("reply %q, want %q", reply, "dns q")
	}
	return err
}

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
			want := freeUDPFrontend(t).Port()
			if taken {
				hold, err := net.ListenUDP("udp4", &net.UDPAddr{Port: int(want)})
				if err != nil {
					t.Fatal(err)
				}
				defer hold.Close()
			}
			got := redirectedDNS(t, map[lb.Frontend]uint16{dnsFrontend: want})
			switch {
			case got == 0:
				t.Fatalf("no socket for %v", dnsFrontend)
			case !taken && got != want:
				t.Errorf("socket on port %d, want the preferred %d", got, want)
			case taken && got == want:
				t.Errorf("socket on the taken port %d", got)
			}
			if err := askDNS(t, "127.0.0.1", got); err != nil {
				t.Errorf("through the socket: %v", err)
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
	port := redirectedDNS(t, nil)
	if port == 0 {
		t.Fatal("no socket for the frontend")
	}
	if err := askDNS(t, "127.0.0.3", port); err != nil {
		t.Errorf("from 127.0.0.1 to 127.0.0.3: %v; want the reply from 127.0.0.3", err)
	}
}
