package forwarder

import (
	"bufio"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/lb"
)

// insideClient is the loopback address the short-circuit tests' clients
// inside the cluster connect from; others connect from 127.0.0.1.
var insideClient = netip.MustParseAddr("127.0.0.2")

// shortCircuitHarness serves services for node n1 with Config.Inside
// saying that insideClient alone is inside the cluster.
func shortCircuitHarness(t *testing.T, services ...lb.Service) *harness {
	t.Helper()
	h := newHarness(t, Config{Inside: func(a netip.Addr) bool { return a == insideClient }})
	h.store = lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: "n1"}})
	h.replace(services...)
	return h
}

// externalLocal makes svc's frontend an ExternalIP with externalTrafficPolicy
// Local and puts its endpoints on the nodes given, in order.
func externalLocal(svc lb.Service, nodes ...string) lb.Service {
	svc.ExternalIPs, svc.ClusterIPs = svc.ClusterIPs, nil
	svc.ExternalTrafficPolicy = lb.PolicyLocal
	for i, n := range nodes {
		svc.Endpoints[i].NodeName = n
	}
	return svc
}

// nameFrom connects to addr from the local address from and returns the
// backend's name, or the error (a reset: refused).
func nameFrom(from netip.Addr, addr netip.AddrPort) (string, error) {
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0))}
	c, err := d.Dial("tcp", addr.String())
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// TestShortCircuit: a client inside the cluster (Config.Inside) that
// connects to an external frontend of a Service with externalTrafficPolicy
// Local is served by the endpoints on every node, as kube-proxy
// short-circuits it; a client outside gets this node's endpoints only, and
// a reset when there are none here. Over TCP and UDP.
func TestShortCircuit(t *testing.T) {
	leakCheck(t)
	here, there := startBackend(t, "here", modeName), startBackend(t, "there", modeName)
	fe := freeFrontend(t)
	both := externalLocal(service("web", fe, here.addr, there.addr), "n1", "n2")
	h := shortCircuitHarness(t, both)

	seen := func(from netip.Addr) map[string]int {
		t.Helper()
		got := map[string]int{}
		for range 6 {
			name, err := nameFrom(from, fe)
			if err != nil {
				t.Fatalf("from %v: %v", from, err)
			}
			got[name]++
		}
		return got
	}
	if got := seen(loopback4); got["here"] != 6 {
		t.Errorf("outside: backends %v, want only this node's (here)", got)
	}
	if got := seen(insideClient); got["here"] == 0 || got["there"] == 0 {
		t.Errorf("inside: backends %v, want both nodes' endpoints", got)
	}

	// No endpoint on this node: outside is refused, inside still served.
	onlyThere := externalLocal(service("web", fe, there.addr), "n2")
	h.replace(onlyThere)
	if name, err := nameFrom(loopback4, fe); !isReset(err) {
		t.Errorf("outside, no local endpoint: got %q, %v; want a reset", name, err)
	}
	if got := seen(insideClient); got["there"] != 6 {
		t.Errorf("inside, no local endpoint: backends %v, want there", got)
	}

	// The same over UDP.
	ufe := freeUDPFrontend(t)
	echo := startUDPEcho(t, "there")
	dns := externalLocal(udpService("dns", ufe, echo.addr), "n2")
	h.replace(onlyThere, dns)
	queryFrom := func(from netip.Addr) ([]byte, error) {
		c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(from, 0)), net.UDPAddrFromAddrPort(ufe))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return ask(c, []byte("q"))
	}
	if reply, err := queryFrom(insideClient); err != nil || string(reply) != "there q" {
		t.Errorf("UDP inside: %q, %v; want \"there q\"", reply, err)
	}
	if reply, err := queryFrom(loopback4); err == nil {
		t.Errorf("UDP outside, no local endpoint: answered %q, want no answer", reply)
	}
	h.settle()
}

// TestShortCircuitNeedsInside: without Config.Inside no client is inside,
// and an external frontend of a Service with externalTrafficPolicy Local
// serves this node's endpoints alone.
func TestShortCircuitNeedsInside(t *testing.T) {
	leakCheck(t)
	there := startBackend(t, "there", modeName)
	fe := freeFrontend(t)
	h := newHarness(t, Config{})
	h.store = lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: "n1"}})
	h.replace(externalLocal(service("web", fe, there.addr), "n2"))
	if name, err := nameFrom(insideClient, fe); !isReset(err) {
		t.Errorf("got %q, %v; want a reset", name, err)
	}
	h.settle()
}
