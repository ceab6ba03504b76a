package e2e

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// TestPrivilegedUDPFrontends: a UDP Service's frontend socket listens on
// the node's every address but answers only datagrams steered to it (one
// sent straight to the node's address gets nothing), and it keeps its port
// when svcproxy is killed and started again, so a client's flow, which
// conntrack keeps redirecting to that port, goes on being answered.
func TestPrivilegedUDPFrontends(t *testing.T) {
	c := newCluster(t, 2, "")
	client := c.topo.Clients[0]
	ctx := context.Background()
	flow, err := client.Dial(ctx, "udp", udpVIP+":5300")
	if err != nil {
		t.Fatal(err)
	}
	defer flow.Close()
	ask := func(conn net.Conn, msg string) (string, error) {
		buf := make([]byte, 512)
		for try := 0; try < 3; try++ {
			if _, err := conn.Write([]byte(msg)); err != nil {
				return "", err
			}
			_ = conn.SetReadDeadline(time.Now().Add(400 * time.Millisecond))
			n, err := conn.Read(buf)
			if err == nil {
				return string(buf[:n]), nil
			}
			if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
				return "", err
			}
		}
		return "", fmt.Errorf("no reply to %q", msg)
	}
	if _, err := ask(flow, "hello"); err != nil {
		t.Fatalf("through the ClusterIP: %v", err)
	}
	port := c.udpSocketPort(udpVIP, 5300)

	direct, err := client.Dial(ctx, "udp", net.JoinHostPort(c.topo.Node.Addr.String(), strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if reply, err := ask(direct, "straight to the socket"); err == nil {
		t.Errorf("a datagram sent straight to the node's %v:%d, not to the Service, got %q back", c.topo.Node.Addr, port, reply)
	}

	// A crash: the rules stay, and so do conntrack's entries for the flow.
	_ = c.proxy.Process.Kill()
	_ = c.proxy.Wait()
	c.startProxy()
	if got := c.udpSocketPort(udpVIP, 5300); got != port {
		t.Errorf("after a restart the frontend is steered to port %d, before it was %d", got, port)
	}
	if _, err := ask(flow, "after the restart"); err != nil {
		t.Errorf("the client's flow, same socket, after svcproxy was killed and restarted: %v", err)
	}
}

// udpSocketPort is the port svcproxy's rules redirect the UDP frontend
// vip:port to (its forwarder socket's).
func (c *cluster) udpSocketPort(vip string, port int) int {
	c.t.Helper()
	out, err := c.topo.Node.Command(context.Background(), "iptables", "-t", "nat", "-S", "SVCPROXY-UDP").CombinedOutput()
	if err != nil {
		c.t.Fatalf("listing SVCPROXY-UDP: %v: %s", err, out)
	}
	// REDIRECT --to-ports P, or DNAT --to-destination <node IP>:P.
	re := regexp.MustCompile(`-d ` + regexp.QuoteMeta(vip) + `/32 .*--dport ` + strconv.Itoa(port) + ` .*(?:--to-ports |--to-destination \S+:)(\d+)`)
	m := re.FindSubmatch(out)
	if m == nil {
		c.t.Fatalf("no REDIRECT or DNAT rule for %s:%d in\n%s", vip, port, out)
	}
	p, _ := strconv.Atoi(string(m[1]))
	return p
}
