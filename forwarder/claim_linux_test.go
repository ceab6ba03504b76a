package forwarder

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/lb"
)

func TestNodePortsClaimed(t *testing.T) {
	leakCheck(t)
	tcpPort, udpPort := freeFrontend(t).Port(), freeUDPFrontend(t).Port()
	tsvc := service("np-tcp", netip.AddrPortFrom(netip.MustParseAddr("198.18.255.1"), 80))
	tsvc.NodePort = tcpPort
	usvc := udpService("np-udp", netip.AddrPortFrom(netip.MustParseAddr("198.18.255.2"), 53))
	usvc.NodePort = udpPort
	// An SCTP Service on the TCP NodePort's number: no SCTP socket can
	// claim it, and it must not take the TCP claim's place.
	ssvc := service("np-sctp", netip.AddrPortFrom(netip.MustParseAddr("198.18.255.3"), 3868))
	ssvc.Protocol, ssvc.NodePort = lb.SCTP, tcpPort
	store := lb.NewStore(lb.StoreOptions{})
	snap, err := store.Replace([]lb.Service{tsvc, usvc, ssvc})
	if err != nil {
		t.Fatal(err)
	}
	fwd, err := New(Config{ClaimNodePorts: true, Mark: -1, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer fwd.Shutdown(context.Background())
	if err := fwd.Apply(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	if got := fwd.ClaimedNodePorts(); len(got) != 2 {
		t.Errorf("claimed %v, want the TCP and the UDP NodePort only", got)
	}
	// One claim holds the port in both families, as a Service's NodePort
	// serves both.
	for _, network := range []string{"tcp", "tcp4", "tcp6"} {
		if ln, err := net.Listen(network, fmt.Sprintf(":%d", tcpPort)); err == nil {
			ln.Close()
			t.Errorf("another program could listen (%s) on claimed TCP NodePort %d", network, tcpPort)
		}
	}
	for _, network := range []string{"udp", "udp4", "udp6"} {
		if pc, err := net.ListenPacket(network, fmt.Sprintf(":%d", udpPort)); err == nil {
			pc.Close()
			t.Errorf("another program could bind (%s) claimed UDP NodePort %d", network, udpPort)
		}
	}
	// A claim never serves: a stray connection is refused, not left hanging.
	if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", tcpPort), time.Second); err == nil {
		c.Close()
		t.Errorf("connected to a claim socket")
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dialing a claimed port: %v, want connection refused", err)
	}
	// Released when the Service goes.
	snap, _ = store.Replace(nil)
	if err := fwd.Apply(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", tcpPort))
	if err != nil {
		t.Fatalf("NodePort %d still held after its Service was removed: %v", tcpPort, err)
	}
	ln.Close()
}
