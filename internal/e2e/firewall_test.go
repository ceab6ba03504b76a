package e2e

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/firewall"
	"github.com/svcproxy/svcproxy/netfilter/nftable"
)

// TestPrivilegedLoadBalancerSourceRanges runs the binary in each mode (and
// steering) this machine has, with a dual-stack LoadBalancer Service whose
// ranges take the client pods' networks but not the node: the client
// reaches its LoadBalancer IPs, the node does not, and the node still
// reaches its ClusterIP (never restricted). A clean stop removes the
// firewall.
func TestPrivilegedLoadBalancerSourceRanges(t *testing.T) {
	const fencedVIP, fencedLB, fencedLB6 = "198.19.0.20", "198.19.2.20", "fd00:19:2::20"
	extra := fmt.Sprintf(`  - name: fenced
    namespace: e2e
    clusterIPs: [%s, "fd00:19::20"]
    loadBalancerIPs: [%s, "%s"]
    loadBalancerSourceRanges: [198.18.1.0/24, "fd00:18:1::/64"]
    ports:
      - port: 80
        targetPort: 8080
    endpoints:
      - ip: 198.18.2.1
      - ip: "fd00:18:2::1"
`, fencedVIP, fencedLB, fencedLB6)
	lb6 := net.JoinHostPort(fencedLB6, "80")
	for _, args := range [][]string{
		{"--steering=redirect"},
		{"--steering=local"},
		{"--proxy-mode=iptables", "--cluster-cidr=198.18.1.0/24"},
		{"--proxy-mode=nftables", "--cluster-cidr=198.18.1.0/24"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			c := newCluster(t, 1, extra, args...)
			if !strings.Contains(c.proxyOut.String(), "serving IPv4 and IPv6") {
				t.Fatalf("svcproxy does not serve IPv6 here; output:\n%s", c.proxyOut)
			}
			client, node := c.topo.Clients[0], c.topo.Node
			for _, lbAddr := range []string{fencedLB + ":80", lb6} {
				if _, err := c.get(client, lbAddr); err != nil {
					t.Errorf("the client, inside the ranges, to %s: %v", lbAddr, err)
				}
				if _, err := c.getWithin(node, lbAddr, 500*time.Millisecond); err == nil {
					t.Errorf("the node, outside the ranges, reached %s", lbAddr)
				}
			}
			if _, err := c.get(node, fencedVIP+":80"); err != nil {
				t.Errorf("the node to the ClusterIP: %v", err)
			}
			c.stopProxy()
			tables, err := nftable.ListTables(node.NS)
			if err != nil {
				t.Fatal(err)
			}
			for _, fam := range []string{"ip ", "ip6 "} {
				if slices.Contains(tables, fam+firewall.Table) {
					t.Errorf("%s%s left after a clean stop: %v", fam, firewall.Table, tables)
				}
			}
		})
	}
}
