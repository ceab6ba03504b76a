package e2e

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/internal/topology"
)

// TestPrivilegedShortCircuit runs the userspace mode's short circuit of
// externalTrafficPolicy Local through the binary and the kernel, with both
// steerings: a Service whose endpoints all run on another node serves a
// pod (the client, within --cluster-cidr) and the node itself at its
// LoadBalancer IP and NodePort with those endpoints, as kube-proxy does.
// Without --cluster-cidr the client is outside the cluster and refused
// (REDIRECT steering leaves it to the kernel's reject rule, as kube-proxy
// does; local steering's forwarder accepts and resets); the node is still
// inside.
func TestPrivilegedShortCircuit(t *testing.T) {
	const lbIP, nodePort = "198.19.2.20", 30120
	// The backends' addresses are the topology's first two (198.18.2.1,
	// .2); the client is 198.18.1.1.
	extra := fmt.Sprintf(`  - name: ingress
    namespace: e2e
    clusterIPs: [198.19.0.20]
    loadBalancerIPs: [%s]
    externalTrafficPolicy: Local
    ports:
      - port: 80
        targetPort: 8080
        nodePort: %d
    endpoints:
      - ip: 198.18.2.1
        nodeName: elsewhere
      - ip: 198.18.2.2
        nodeName: elsewhere
`, lbIP, nodePort)
	for _, steering := range []string{"redirect", "local"} {
		for _, pods := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s, pods told: %v", steering, pods), func(t *testing.T) {
				args := []string{"--steering=" + steering}
				if pods {
					args = append(args, "--cluster-cidr=198.18.1.0/24")
				}
				c := newCluster(t, 2, extra, args...)
				client, node := c.topo.Clients[0], c.topo.Node
				lb, np := lbIP+":80", fmt.Sprintf("%s:%d", topology.NodeAddr, nodePort)
				c.spread(node, lb, 20)
				c.spread(node, np, 20)
				if pods {
					c.spread(client, lb, 20)
					c.spread(client, np, 20)
					return
				}
				for _, addr := range []string{lb, np} {
					if name, err := c.get(client, addr); err == nil {
						t.Errorf("a client outside the cluster reached %s (%s), with no endpoint on this node", addr, name)
					}
					if steering != "redirect" {
						continue // the forwarder listens there, accepts and resets
					}
					// Steering leaves it to the kernel, which refuses the
					// connection, as where a Service has no endpoint at all.
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					conn, err := client.Dial(ctx, "tcp", addr)
					cancel()
					if err == nil {
						conn.Close()
						t.Errorf("a client outside the cluster connected to %s: want the connection refused by the steering rules", addr)
					} else if !errors.Is(err, syscall.ECONNREFUSED) {
						t.Errorf("a client outside the cluster dialling %s: %v, want connection refused", addr, err)
					}
				}
			})
		}
	}
}
