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
// kernel, with both backends, REDIRECT and DNAT, in both families: an
// externalTrafficPolicy Local Service whose endpoint runs on another node
// is steered to the forwarder for a pod (a second address of the client
// namespace, the cluster CIDR) and for the node, at its ExternalIP and its
// NodePort; the client's other address, outside the cluster, is refused at
// connect by the reject rules. (UDP is left to the fakes, and so is an
// IPv6 ExternalIP reached from the client namespace: in this topology,
// whose node routes the VIPs back out of the client's link, a connection
// from one source address of the client after one from the other was
// forwarded past both the steering and the reject rules on nf_tables
// (iptables-nft and nftables, not iptables-legacy), not understood yet;
// the NodePort, reached at the node's own address, is tested in IPv6.)
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
		for _, dnat := range []bool{false, true} {
			name := b.name + "/redirect"
			if dnat {
				name = b.name + "/dnat"
			}
			t.Run(name, func(t *testing.T) { testShortCircuitTraffic(t, b.backend, b.variant, dnat) })
		}
	}
}

func testShortCircuitTraffic(t *testing.T, backend Backend, variant string, dnat bool) {
	top := newTopology(t)
	const pod, pod6 = "198.18.0.3", "fd00:18::3"
	kerneltest.Run(t, "ip", "-n", top.client, "addr", "add", pod+"/24", "dev", "eth0")
	kerneltest.Run(t, "ip", "-n", top.client, "addr", "add", pod6+"/64", "dev", "eth0", "nodad")
	node4, node6 := top.nodeAddrs[0].String(), "["+top.nodeAddrs[1].String()+"]"
	var nodeIPs []netip.Addr
	if dnat {
		nodeIPs = top.nodeAddrs[:]
	}
	accepted := acceptRedirected(t, redirectListeners(t, top.node)...)
	services := []lb.Service{{
		Name: svcName("ingress"), Port: 80, NodePort: 30083,
		ClusterIPs:            []netip.Addr{ip("198.18.10.3")},
		ExternalIPs:           []netip.Addr{ip("198.18.10.4"), ip("fd00:10::4")},
		ExternalTrafficPolicy: lb.PolicyLocal,
		Endpoints:             eps(1, "elsewhere"),
	}}
	r, err := New(Config{Backend: backend, NetNS: top.node, Mark: testMark, IPv6: true, NodeIPs: nodeIPs,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(pod + "/32"), netip.MustParsePrefix(pod6 + "/128")},
		Exec:         &netfilter.Exec{NetNS: top.node, Variant: variant}, Logger: zaptest.NewLogger(t)})
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
		{"IPv6 pod to the NodePort", top.client, pod6, node6 + ":30083", true},
		{"node to the IPv6 ExternalIP", top.node, "", "[fd00:10::4]:80", true},
		{"IPv6 outside to the NodePort", top.client, "fd00:18::2", node6 + ":30083", false},
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
}
