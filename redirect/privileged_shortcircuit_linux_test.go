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
// connect by the reject rules (TCP reset; ICMP port unreachable for UDP);
// a UDP ExternalIP answers the pod and the node, not the outside client.
//
// Two things of this topology, not of the steering, are set aside. The
// node routes the VIPs back out of the client's link, so it answers a
// forwarded datagram with an ICMP redirect before its FORWARD hook
// rejects it, and the redirect spends the per-host ICMP token the port
// unreachable then needs (IcmpOutRateLimitHost): the node sends no
// redirects here. And the node's neighbour solicitations for the client
// address it had not heard from yet went unanswered for a second or more,
// so its reply (the redirected connection's SYN-ACK, the reject's reset)
// to whichever of the two client addresses came second waited in the
// neighbour queue past the dial's timeout: what made IPv6 ExternalIPs look
// unsteered and unrejected in an earlier version of this test (counters
// showed the rules matching and the reset leaving every hook, and the
// solicitation reaching the client namespace and dropped before ICMPv6).
// The node knows both client addresses' link-layer address from the
// start.
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
	kerneltest.Run(t, "ip", "netns", "exec", top.node, "sysctl", "-qw", "net.ipv4.conf.all.send_redirects=0", "net.ipv4.conf.eth0.send_redirects=0")
	var clientMAC string
	kerneltest.Do(t, top.client, func() {
		ifc, err := net.InterfaceByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		clientMAC = ifc.HardwareAddr.String()
	})
	for _, a := range []string{"fd00:18::2", pod6} {
		kerneltest.Run(t, "ip", "-n", top.node, "neigh", "replace", a, "lladdr", clientMAC, "dev", "eth0", "nud", "permanent")
	}
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
	}, {
		Name: svcName("dns"), Protocol: lb.UDP, Port: 53,
		ClusterIPs:            []netip.Addr{ip("198.18.10.5")},
		ExternalIPs:           []netip.Addr{ip("198.18.10.6")},
		ExternalTrafficPolicy: lb.PolicyLocal,
		Endpoints:             eps(1, "elsewhere"),
	}}
	// The UDP ExternalIP's forwarder socket: it answers from the address
	// the datagram was steered to.
	const udpPort = 40063
	var udp *net.UDPConn
	kerneltest.Do(t, top.node, func() {
		var err error
		if udp, err = net.ListenUDP("udp4", &net.UDPAddr{Port: udpPort}); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { udp.Close() })
	pktinfoServer(t, udp)
	ports := Ports{TCP: testTCPPort, UDP: map[lb.Frontend]uint16{
		{Protocol: lb.UDP, Addr: ap("198.18.10.6:53")}: udpPort,
		{Protocol: lb.UDP, Addr: ap("198.18.10.5:53")}: udpPort + 1, // not asked here
	}}
	r, err := New(Config{Backend: backend, NetNS: top.node, Mark: testMark, IPv6: true, NodeIPs: nodeIPs,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(pod + "/32"), netip.MustParsePrefix(pod6 + "/128")},
		Exec:         &netfilter.Exec{NetNS: top.node, Variant: variant}, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, r, store(t, services...).Snapshot(), ports, true)
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
		{"IPv6 pod to the ExternalIP", top.client, pod6, "[fd00:10::4]:80", true},
		{"IPv6 pod to the NodePort", top.client, pod6, node6 + ":30083", true},
		{"node to the IPv6 ExternalIP", top.node, "", "[fd00:10::4]:80", true},
		{"IPv6 outside to the ExternalIP", top.client, "fd00:18::2", "[fd00:10::4]:80", false},
		{"IPv6 outside to the NodePort", top.client, "fd00:18::2", node6 + ":30083", false},
		{"IPv6 pod to the ExternalIP again", top.client, pod6, "[fd00:10::4]:80", true},
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

	// UDP: a pod and the node are answered through the forwarder's socket;
	// an outside client's datagram is not steered, and the reject rule
	// answers it with an ICMP port unreachable (ECONNREFUSED).
	for _, tc := range []struct {
		name, ns, src string
		answered      bool
	}{
		{"UDP pod to the ExternalIP", top.client, pod, true},
		{"UDP node to the ExternalIP", top.node, "", true},
		{"UDP outside to the ExternalIP", top.client, "198.18.0.2", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c *net.UDPConn
			kerneltest.Do(t, tc.ns, func() {
				var laddr *net.UDPAddr
				if tc.src != "" {
					laddr = &net.UDPAddr{IP: net.ParseIP(tc.src)}
				}
				var err error
				if c, err = net.DialUDP("udp4", laddr, &net.UDPAddr{IP: net.ParseIP("198.18.10.6"), Port: 53}); err != nil {
					t.Fatal(err)
				}
			})
			defer c.Close()
			if _, err := c.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			wait := 2 * time.Second
			if !tc.answered {
				wait = 300 * time.Millisecond // the ICMP error comes back at once
			}
			c.SetReadDeadline(time.Now().Add(wait))
			buf := make([]byte, 100)
			n, err := c.Read(buf)
			switch {
			case tc.answered && err != nil:
				t.Fatalf("no answer: %v", err)
			case tc.answered && string(buf[:n]) != "pong:ping":
				t.Errorf("answer %q, want %q", buf[:n], "pong:ping")
			case !tc.answered && err == nil:
				t.Errorf("answered %q: the datagram was steered", buf[:n])
			case !tc.answered && !errors.Is(err, syscall.ECONNREFUSED):
				t.Errorf("read: %v, want connection refused (the reject rule's ICMP port unreachable)", err)
			}
		})
	}
}
