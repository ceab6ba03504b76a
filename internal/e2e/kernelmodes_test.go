package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/svcproxy/svcproxy/internal/topology"
)

// TestPrivilegedIPTablesModeWithFallback asks for the IPVS mode on a
// kernel without IPVS: svcproxy falls back to the iptables DNAT mode, says
// so in a log line and a metric, and the kernel then forwards every Service
// type itself. Its rules outlive the process (as kube-proxy's do) and
// --cleanup removes them.
func TestPrivilegedIPTablesModeWithFallback(t *testing.T) {
	c := newCluster(t, 3, "", "--proxy-mode=ipvs", "--cluster-cidr=198.18.1.0/24")
	if !strings.Contains(c.proxyOut.String(), "proxy mode fell back") {
		t.Fatalf("no fallback log line; output:\n%s", c.proxyOut)
	}
	if got := c.metric(t, `svcproxy_proxy_mode{mode="iptables",requested="ipvs"}`); got != 1 {
		t.Fatalf(`svcproxy_proxy_mode{mode="iptables",requested="ipvs"} = %v, want 1`, got)
	}
	client := c.topo.Clients[0]
	for _, tc := range []struct {
		name string
		from *topology.Host
		addr string
	}{
		{"ClusterIP from a pod", client, webVIP + ":80"},
		{"ClusterIP from the node", c.topo.Node, webVIP + ":80"},
		{"NodePort", client, fmt.Sprintf("%s:%d", topology.NodeAddr, webNode)},
		{"ExternalIP", client, webExtIP + ":80"},
		{"LoadBalancer IP", client, webLBIP + ":80"},
	} {
		t.Run(tc.name, func(t *testing.T) { c.spread(tc.from, tc.addr, 40) })
	}
	t.Run("no endpoints is refused at once", func(t *testing.T) {
		conn, took, err := dialTimed(client, "tcp", emptyVIP+":80")
		if err == nil {
			conn.Close()
			t.Fatal("connected to a Service with no endpoints")
		}
		if took.Milliseconds() > 100 {
			t.Errorf("refusal took %v", took)
		}
	})
	t.Run("rules outlive the process; --cleanup removes them", func(t *testing.T) {
		c.stopProxy()
		if _, err := c.get(client, webVIP+":80"); err != nil {
			t.Errorf("with svcproxy stopped the kernel should still forward: %v", err)
		}
		out, err := c.topo.Node.Command(context.Background(), bins.svcproxy, "--cleanup").CombinedOutput()
		if err != nil {
			t.Fatalf("--cleanup: %v\n%s", err, out)
		}
		if got := c.nodeRules(); got != c.saved {
			t.Fatalf("rules after --cleanup differ from before:\nbefore:\n%s\nafter:\n%s", c.saved, got)
		}
	})
}
