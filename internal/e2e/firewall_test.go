package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/firewall"
	"github.com/svcproxy/svcproxy/netfilter/nftable"
)

// TestPrivilegedLoadBalancerSourceRanges runs the binary in each mode (and
// steering) this machine has, with a LoadBalancer Service whose ranges take
// the client pods' network but not the node: the client reaches its
// LoadBalancer IP, the node does not, and the node still reaches its
// ClusterIP (never restricted). A clean stop removes the firewall.
func TestPrivilegedLoadBalancerSourceRanges(t *testing.T) {
	const fencedVIP, fencedLB = "198.19.0.20", "198.19.2.20"
	extra := fmt.Sprintf(`  - name: fenced
    namespace: e2e
    clusterIPs: [%s]
    loadBalancerIPs: [%s]
    loadBalancerSourceRanges: [198.18.1.0/24]
    ports:
      - port: 80
        targetPort: 8080
    endpoints:
      - ip: 198.18.2.1
`, fencedVIP, fencedLB)
	for _, args := range [][]string{
		{"--steering=redirect"},
		{"--steering=local"},
		{"--proxy-mode=iptables", "--cluster-cidr=198.18.1.0/24"},
		{"--proxy-mode=nftables", "--cluster-cidr=198.18.1.0/24"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			c := newCluster(t, 1, extra, args...)
			client, node := c.topo.Clients[0], c.topo.Node
			if _, err := c.get(client, fencedLB+":80"); err != nil {
				t.Errorf("the client, inside the ranges: %v", err)
			}
			if _, err := c.getWithin(node, fencedLB+":80", 500*time.Millisecond); err == nil {
				t.Error("the node, outside the ranges, reached the LoadBalancer IP")
			}
			if _, err := c.get(node, fencedVIP+":80"); err != nil {
				t.Errorf("the node to the ClusterIP: %v", err)
			}
			c.stopProxy()
			tables, err := nftable.ListTables(node.NS)
			if err != nil {
				t.Fatal(err)
			}
			if slices.Contains(tables, "ip "+firewall.Table) {
				t.Errorf("%s left after a clean stop: %v", firewall.Table, tables)
			}
		})
	}
}
