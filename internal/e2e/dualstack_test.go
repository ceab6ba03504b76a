package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/internal/proctest"
	"github.com/svcproxy/svcproxy/internal/topology"
)

// A dual-stack Service per protocol: a ClusterIP of each family and a
// NodePort.
const (
	dualVIP4, dualVIP6       = "198.19.0.20", "fd00:19::20"
	dualUDPVIP4, dualUDPVIP6 = "198.19.0.21", "fd00:19::21"
	dualNode, dualUDPNode    = 30081, 30053
)

// dualStackServices lists every backend in both families, as Kubernetes
// gives a dual-stack Service an EndpointSlice per family.
func dualStackServices(backends []*topology.Host) string {
	var eps strings.Builder
	for _, h := range backends {
		fmt.Fprintf(&eps, "      - ip: %s\n      - ip: %s\n", h.Addr, h.Addr6)
	}
	return fmt.Sprintf(`
  - name: dual-web
    namespace: e2e
    clusterIPs: [%s, %s]
    ports:
      - port: 80
        targetPort: 8080
        nodePort: %d
    endpoints:
%s
  - name: dual-udp
    namespace: e2e
    clusterIPs: [%s, %s]
    ports:
      - port: 5300
        protocol: UDP
        nodePort: %d
    endpoints:
%s`, dualVIP4, dualVIP6, dualNode, eps.String(), dualUDPVIP4, dualUDPVIP6, dualUDPNode, eps.String())
}

// TestPrivilegedDualStackUserspace: svcproxy finds IPv6 on the node and, in
// userspace mode with REDIRECT steering and with local steering, serves a
// dual-stack Service over IPv6 TCP and UDP (ClusterIP and NodePort, from a
// pod, ClusterIPs also from the node itself) through the forwarder to backends'
// IPv6 addresses, while its IPv4 ClusterIP, and the IPv4-only Services,
// keep working. With a primary IP known (--bind-address here, the Node's
// InternalIP in a cluster), REDIRECT steering DNATs that family to it
// instead.
func TestPrivilegedDualStackUserspace(t *testing.T) {
	proctest.NeedTools(t, "ip6tables", "ip6tables-save")
	for _, tc := range []struct {
		name string
		args []string
		dnat bool // IPv4 is DNATed to the node's address
	}{
		{"redirect", []string{"--steering=redirect"}, false},
		{"redirect, IPv4 DNATed to the primary IP", []string{"--steering=redirect", "--bind-address=" + topology.NodeAddr.String()}, true},
		{"local", []string{"--steering=local"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) { testDualStackUserspace(t, tc.args, tc.dnat) })
	}
}

func testDualStackUserspace(t *testing.T, args []string, dnat bool) {
	c := newCluster(t, 2, "", args...)
	if rules := c.nodeRules(); strings.Contains(rules, "DNAT --to-destination "+topology.NodeAddr.String()+":") != dnat {
		t.Fatalf("DNAT to the node's address in the rules: %v, want %v:\n%s", !dnat, dnat, rules)
	}
	c.checkDualStack(t)

	t.Run("the forwarder carried IPv6 end to end", func(t *testing.T) {
		// The connection log names client, frontend and backend: a
		// client's IPv6 connection to the IPv6 ClusterIP went to a
		// backend's IPv6 address (the forwarder dials either family).
		want := netip.MustParseAddrPort("[" + dualVIP6 + "]:80")
		deadline := time.Now().Add(3 * time.Second)
		for {
			data, _ := os.ReadFile(filepath.Join(c.dir, "connections.log"))
			for _, line := range bytes.Split(data, []byte("\n")) {
				var rec struct{ Client, Frontend, Backend string }
				if json.Unmarshal(line, &rec) != nil || rec.Frontend != want.String() {
					continue
				}
				client, _ := netip.ParseAddrPort(rec.Client)
				backend, _ := netip.ParseAddrPort(rec.Backend)
				if topology.Range6.Contains(client.Addr()) && topology.Range6.Contains(backend.Addr()) {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no connection log line from an IPv6 client through %v to an IPv6 backend:\n%s", want, data)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
}

// TestPrivilegedDualStackIPTables: the same dual-stack traffic through the
// iptables mode, where the kernel DNATs IPv6 with ip6tables rules.
func TestPrivilegedDualStackIPTables(t *testing.T) {
	proctest.NeedTools(t, "ip6tables", "ip6tables-save")
	c := newCluster(t, 2, "", "--proxy-mode=iptables")
	if got := c.metric(t, `svcproxy_proxy_mode{mode="iptables",requested="iptables"}`); got != 1 {
		t.Fatalf("not in the iptables mode; output:\n%s", c.proxyOut)
	}
	c.checkDualStack(t)
}

// checkDualStack adds the dual-stack Services (the services file is
// reloaded on change) and sends their traffic through the node.
func (c *cluster) checkDualStack(t *testing.T) {
	t.Helper()
	if !strings.Contains(c.proxyOut.String(), "serving IPv4 and IPv6") {
		t.Fatalf("svcproxy did not find IPv6 on the node; output:\n%s", c.proxyOut)
	}
	c.writeServices(dualStackServices(c.topo.Backends))
	client := c.topo.Clients[0]
	v6 := func(ip string, port int) string { return fmt.Sprintf("[%s]:%d", ip, port) }
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := c.get(client, v6(dualVIP6, 80)); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the IPv6 ClusterIP did not answer within 20s of adding it: %v; output:\n%s", err, c.proxyOut)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, tc := range []struct {
		name string
		from *topology.Host
		addr string
	}{
		{"IPv6 ClusterIP from a pod", client, v6(dualVIP6, 80)},
		{"IPv6 ClusterIP from the node", c.topo.Node, v6(dualVIP6, 80)},
		{"IPv6 NodePort", client, v6(topology.NodeAddr6.String(), dualNode)},
		{"IPv4 ClusterIP of the dual-stack Service", client, dualVIP4 + ":80"},
		{"IPv4-only Service", client, webVIP + ":80"},
	} {
		t.Run(tc.name, func(t *testing.T) { c.spread(tc.from, tc.addr, 20) })
	}
	// From the node, a connected client socket takes only replies from the
	// ClusterIP it wrote to: with REDIRECT, only if the forwarder answers
	// from the loopback address the datagram arrived at.
	for _, tc := range []struct {
		name string
		from *topology.Host
		addr string
	}{
		{"UDP to the IPv6 ClusterIP", client, v6(dualUDPVIP6, 5300)},
		{"UDP to the IPv6 NodePort", client, v6(topology.NodeAddr6.String(), dualUDPNode)},
		{"UDP to the IPv4 ClusterIP", client, dualUDPVIP4 + ":5300"},
		{"UDP to the IPv4 ClusterIP from the node", c.topo.Node, dualUDPVIP4 + ":5300"},
		{"UDP to the IPv6 ClusterIP from the node", c.topo.Node, v6(dualUDPVIP6, 5300)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := map[string]bool{}
			for i := range 20 { // a new client socket each: a new flow
				msg := fmt.Appendf(nil, "query %d", i)
				reply, err := udpQuery(tc.from, tc.addr, msg)
				if err != nil {
					t.Fatalf("query %d to %s: %v", i, tc.addr, err)
				}
				name, rest, _ := bytes.Cut(reply, []byte(" "))
				if !bytes.Equal(rest, msg) {
					t.Fatalf("query %d to %s: reply %q", i, tc.addr, reply)
				}
				seen[string(name)] = true
			}
			for _, b := range c.backends {
				if !seen[b.name] {
					t.Errorf("%s: backend %s answered none of 20 queries (%v)", tc.addr, b.name, seen)
				}
			}
		})
	}
}
