package e2e

import (
	"context"
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
// reaches its ClusterIP (never restricted). A clean stop leaves the
// firewall, as the kernel modes leave their rules; --cleanup removes it.
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
			// The kernel modes' rules outlive the process, and so does the
			// firewall: stopped, nothing is served unrestricted.
			c.stopProxy()
			has := func(fam string) bool {
				t.Helper()
				tables, err := nftable.ListTables(node.NS)
				if err != nil {
					t.Fatal(err)
				}
				return slices.Contains(tables, "table "+fam+" "+firewall.Table)
			}
			for _, fam := range []string{"ip", "ip6"} {
				if !has(fam) {
					t.Errorf("%s %s gone after a clean stop", fam, firewall.Table)
				}
			}
			if strings.Contains(strings.Join(args, " "), "--proxy-mode") { // the kernel still forwards
				if _, err := c.getWithin(node, fencedLB+":80", 500*time.Millisecond); err == nil {
					t.Error("with svcproxy stopped, the node reached the LoadBalancer IP the kernel still forwards")
				}
			}
			if out, err := node.Command(context.Background(), bins.svcproxy, "--cleanup").CombinedOutput(); err != nil {
				t.Fatalf("--cleanup: %v\n%s", err, out)
			}
			for _, fam := range []string{"ip", "ip6"} {
				if has(fam) {
					t.Errorf("%s %s left after --cleanup", fam, firewall.Table)
				}
			}
		})
	}
}
