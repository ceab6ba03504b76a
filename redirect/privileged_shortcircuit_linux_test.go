package redirect

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/internal/kerneltest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// TestPrivilegedShortCircuit is TestShortCircuitSteering through the real
// kernel, with both backends: an externalTrafficPolicy Local Service whose
// endpoint runs on another node is steered to the forwarder for a pod (a
// second address of the client namespace, the cluster CIDR) and for the
// node, at its ExternalIP and its NodePort; the client's other address,
// outside the cluster, is refused at connect by the reject rules.
func TestPrivilegedShortCircuit(t *testing.T) {
	privileged.Require(t)
	type backend struct {
		name    string
		backend Backend
		variant string
	}
	var backends []backend
	for _, v := range kerneltest.Variants() {
		backends = append(backends, backend{"iptables/" + kerneltest.VariantName(v), BackendIPTables, v})
	}
	backends = append(backends, backend{"nftables", BackendNFTables, ""})
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			top := newTopology(t)
			const pod = "198.18.0.3"
			kerneltest.Run(t, "ip", "-n", top.client, "addr", "add", pod+"/24", "dev", "eth0")
			node4 := top.nodeAddrs[0].String()
			accepted := acceptRedirected(t, redirectListeners(t, top.node)...)
			services := []lb.Service{{
				Name: svcName("ingress"), Port: 80, NodePort: 30083,
				ClusterIPs:            []netip.Addr{ip("198.18.10.3")},
				ExternalIPs:           []netip.Addr{ip("198.18.10.4")},
				ExternalTrafficPolicy: lb.PolicyLocal,
				Endpoints:             eps(1, "elsewhere"),
			}}
			r, err := New(Config{Backend: b.backend, NetNS: top.node, Mark: testMark, IPv6: true,
				ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(pod + "/32")},
				Exec:         &netfilter.Exec{NetNS: top.node, Variant: b.variant}, Logger: zaptest.NewLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			mustApply(t, r, store(t, services...).Snapshot(), Ports{TCP: testTCPPort}, true)
			t.Cleanup(func() {
				if err := r.Cleanup(context.Background()); err != nil {
					t.Errorf("Cleanup: %v", err)
				}
			})
			dial := func(ns, src, dst string) (net.Conn, error) {
				d := net.Dialer{Timeout: 2 * time.Second}
				if src != "" {
					d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
				}
				var c net.Conn
				var err error
				kerneltest.Do(t, ns, func() { c, err = d.Dial("tcp", dst) })
				return c, err
			}
			for _, tc := range []struct {
				name, ns, src, dst string
				steered            bool
			}{
				{"pod to the ExternalIP", top.client, pod, "198.18.10.4:80", true},
				{"pod to the NodePort", top.client, pod, node4 + ":30083", true},
				{"node to the ExternalIP", top.node, "", "198.18.10.4:80", true},
				{"node to the NodePort on loopback", top.node, "", "127.0.0.1:30083", true},
				{"outside to the ClusterIP", top.client, "198.18.0.2", "198.18.10.3:80", true},
				{"outside to the ExternalIP", top.client, "198.18.0.2", "198.18.10.4:80", false},
				{"outside to the NodePort", top.client, "198.18.0.2", node4 + ":30083", false},
			} {
				t.Run(tc.name, func(t *testing.T) {
					c, err := dial(tc.ns, tc.src, tc.dst)
					if !tc.steered {
						if err == nil {
							c.Close()
							t.Fatal("connected: want refused by the steering's reject rule")
						}
						if !errors.Is(err, syscall.ECONNREFUSED) {
							t.Errorf("dial: %v, want connection refused", err)
						}
						return
					}
					if err != nil {
						t.Fatalf("dial: %v", err)
					}
					defer c.Close()
					select {
					case got := <-accepted:
						if got.String() != tc.dst {
							t.Errorf("SO_ORIGINAL_DST = %v, want %v", got, tc.dst)
						}
					case <-time.After(2 * time.Second):
						t.Fatal("the redirect listener got nothing")
					}
				})
			}
		})
	}
}
