//go:build linux

package redirect

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/internal/kerneltest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// foreignRules are another program's rules, in both families and tables,
// which svcproxy must leave alone (and which make the tables exist, so
// before/after comparisons see them on nf_tables too).
var foreignRules = map[netfilter.Family]string{
	netfilter.IPv4: "*nat\n:FOREIGN - [0:0]\n-A PREROUTING -s 203.0.113.0/24 -j FOREIGN\n-A FOREIGN -p tcp -m tcp --dport 8080 -j REDIRECT --to-ports 9090\n-A POSTROUTING -o eth9 -j MASQUERADE\nCOMMIT\n" +
		"*filter\n-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\n-A FORWARD -m set --match-set foreign-set src -j DROP\nCOMMIT\n",
	netfilter.IPv6: "*nat\n-A OUTPUT -d 2001:db8::1/128 -j RETURN\nCOMMIT\n*filter\n-A INPUT -p udp -m udp --dport 546 -j ACCEPT\nCOMMIT\n",
}

func TestPrivilegedApplyCleanup(t *testing.T) {
	privileged.Require(t)
	for _, variant := range kerneltest.Variants() {
		t.Run(kerneltest.VariantName(variant), func(t *testing.T) {
			ctx := context.Background()
			ns := privileged.NewNS(t)
			e := &netfilter.Exec{NetNS: ns, Variant: variant}
			if err := e.IPSetRestore(ctx, []byte("create foreign-set hash:net family inet\nadd foreign-set 10.0.0.0/8\n")); err != nil {
				t.Fatal(err)
			}
			for fam, rules := range foreignRules {
				if err := e.IPTablesRestore(ctx, fam, []byte(rules)); err != nil {
					t.Fatalf("foreign %v rules: %v", fam, err)
				}
			}
			before := kerneltest.State(t, ns, variant)

			r, err := New(Config{Backend: BackendIPTables, NetNS: ns, Mark: testMark, IPv6: true, Exec: e, Logger: zaptest.NewLogger(t),
				NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/24"), netip.MustParsePrefix("127.0.0.0/8")}})
			if err != nil {
				t.Fatal(err)
			}
			want := "nf_tables"
			if variant == "legacy" {
				want = "legacy"
			}
			if r.IPTables() != want {
				t.Errorf("IPTables() = %q, want %q", r.IPTables(), want)
			}
			st := store(t, testServices()...)
			mustApply(t, r, st.Snapshot(), testPorts(), true)
			t.Logf("after the first Apply:\n%s", kerneltest.State(t, ns, variant))

			// A full sync finds exactly what it wrote: our canonical rule
			// text agrees with this iptables-save.
			mustApply(t, r, st.Snapshot(), testPorts(), true)
			if r.Repairs() != 0 {
				t.Fatalf("Repairs = %d after an untouched full sync: what svcproxy writes and what iptables-save shows disagree", r.Repairs())
			}
			svcs := testServices()
			svcs[3].Endpoints = eps(1, "")
			snap, _ := st.Update([]lb.Service{svcs[3]}, []lb.ServicePortName{svcName("web")})
			mustApply(t, r, snap, testPorts(), false)
			mustApply(t, r, snap, testPorts(), true)
			if r.Repairs() != 0 {
				t.Fatalf("Repairs = %d after incremental syncs", r.Repairs())
			}

			// Tamper with the real thing.
			kerneltest.Run(t, "ip", "netns", "exec", ns, e.Tool(netfilter.IPv4, ""), "-t", "nat", "-F", chainServices)
			kerneltest.Run(t, "ip", "netns", "exec", ns, e.Tool(netfilter.IPv6, ""), "-t", "filter", "-D", "INPUT", "-j", chainReject)
			kerneltest.Run(t, "ip", "netns", "exec", ns, "ipset", "del", "svcproxy-svc-v4", "10.96.0.11,tcp:80")
			// What an older svcproxy might have left: a chain, a set, and
			// jumps with matches of their own.
			kerneltest.Run(t, "ip", "netns", "exec", ns, "ipset", "create", "svcproxy-old", "hash:ip,port")
			if err := e.IPTablesRestore(ctx, netfilter.IPv4, []byte("*nat\n:SVCPROXY-OLD - [0:0]\n"+
				"-A SVCPROXY-OLD -m set --match-set svcproxy-old dst,dst -m comment --comment \"old svcproxy\" -j RETURN\n"+
				"-I PREROUTING 1 -m comment --comment \"old svcproxy\" -s 10.0.0.0/8 -j SVCPROXY-OLD\n"+
				"-A OUTPUT -p tcp -j SVCPROXY-SERVICES\nCOMMIT\n")); err != nil {
				t.Fatalf("leaving stray rules: %v", err)
			}
			tampered := kerneltest.State(t, ns, variant)
			mustApply(t, r, snap, testPorts(), true)
			if r.Repairs() != 1 {
				t.Errorf("Repairs = %d after tampering, want 1", r.Repairs())
			}
			mustApply(t, r, snap, testPorts(), true)
			if r.Repairs() != 1 {
				t.Errorf("Repairs = %d after a clean full sync, want 1", r.Repairs())
			}
			repaired := kerneltest.State(t, ns, variant)
			if repaired == tampered {
				t.Errorf("the repair changed nothing")
			}
			if strings.Contains(repaired, "-old") || strings.Contains(repaired, "OLD") || strings.Contains(repaired, "-A OUTPUT -p tcp -j SVCPROXY") {
				t.Errorf("the repair left stray rules or sets:\n%s", repaired)
			}

			if err := r.Cleanup(ctx); err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			if after := kerneltest.State(t, ns, variant); after != before {
				t.Errorf("after Cleanup:\n%s\nbefore the first Apply:\n%s", after, before)
			}
		})
	}
}

// TestPrivilegedTraffic sends real connections and datagrams through the
// rules, from the node itself (nat OUTPUT) and from a client namespace
// (nat PREROUTING).
func TestPrivilegedTraffic(t *testing.T) {
	privileged.Require(t)
	for _, variant := range kerneltest.Variants() {
		t.Run(kerneltest.VariantName(variant), func(t *testing.T) { testTraffic(t, BackendIPTables, variant, newTopology(t), false) })
	}
	t.Run("nftables", func(t *testing.T) { testTraffic(t, BackendNFTables, "", newTopology(t), false) })
}

// TestPrivilegedUnnumbered: a pod whose veth has no address on the node's
// end (Calico's wiring). REDIRECT drops its IPv4 packets (the kernel
// redirects to the incoming interface's first IPv4 address, and there is
// none; in IPv6 it takes the link-local one, which this kernel serves); a
// DNAT to the node's address (Config.NodeIPs) serves it, and everything
// TestPrivilegedTraffic checks holds.
func TestPrivilegedUnnumbered(t *testing.T) {
	privileged.Require(t)
	for _, backend := range []Backend{BackendIPTables, BackendNFTables} {
		t.Run(string(backend)+"/redirect drops the pod's packets", func(t *testing.T) {
			top := newUnnumberedTopology(t)
			accepted := acceptRedirected(t, redirectListeners(t, top.node)...)
			r, err := New(Config{Backend: backend, NetNS: top.node, Mark: testMark, IPv6: true, Exec: &netfilter.Exec{NetNS: top.node}, Logger: zaptest.NewLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Cleanup(context.Background()) })
			svc := lb.Service{Name: svcName("web"), Port: 80, Endpoints: eps(1, ""), ClusterIPs: []netip.Addr{ip("198.18.10.1"), ip("fd00:10::1")}}
			mustApply(t, r, store(t, svc).Snapshot(), Ports{TCP: testTCPPort}, true)
			// The node itself is served (nat OUTPUT redirects to loopback),
			// which shows the rules are in place.
			c, err := kerneltest.Dial(t, top.node, "tcp", "198.18.10.1:80", 2*time.Second, 0)
			if err != nil {
				t.Fatalf("from the node: %v", err)
			}
			c.Close()
			<-accepted
			if c, err := kerneltest.Dial(t, top.client, "tcp", "198.18.10.1:80", 500*time.Millisecond, 0); err == nil {
				c.Close()
				t.Error("the pod reached 198.18.10.1:80 through REDIRECT: this rig no longer shows the drop the DNAT avoids")
			}
		})
		t.Run(string(backend)+"/dnat to the node's address", func(t *testing.T) {
			testTraffic(t, backend, "", newUnnumberedTopology(t), true)
		})
	}
}

// testTraffic runs the traffic cases on top; dnat steers to the node's
// addresses (Config.NodeIPs) rather than REDIRECT.
func testTraffic(t *testing.T, backend Backend, variant string, top topology, dnat bool) {
	ctx := context.Background()
	const udpPort = 40053
	node4, node6 := top.nodeAddrs[0].String(), "["+top.nodeAddrs[1].String()+"]"
	var nodeIPs []netip.Addr
	if dnat {
		nodeIPs = top.nodeAddrs[:]
	}

	// The forwarder's sockets: the TCP redirect port per family, and the
	// UDP frontend's own socket.
	accepted := acceptRedirected(t, redirectListeners(t, top.node)...)
	var udp *net.UDPConn
	kerneltest.Do(t, top.node, func() {
		var err error
		if udp, err = net.ListenUDP("udp4", &net.UDPAddr{Port: udpPort}); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { udp.Close() })
	pktinfoServer(t, udp)

	services := []lb.Service{
		{Name: svcName("web"), Port: 80, NodePort: 30080, Endpoints: eps(1, ""),
			ClusterIPs: []netip.Addr{ip("198.18.10.1"), ip("fd00:10::1")}},
		{Name: svcName("dead"), Port: 80, NodePort: 30082,
			ClusterIPs: []netip.Addr{ip("198.18.10.2"), ip("fd00:10::2")}},
		{Name: svcName("dns"), Protocol: lb.UDP, Port: 53, Endpoints: eps(1, ""),
			ClusterIPs: []netip.Addr{ip("198.18.10.53")}},
	}
	ports := Ports{TCP: testTCPPort, UDP: map[lb.Frontend]uint16{{Protocol: lb.UDP, Addr: ap("198.18.10.53:53")}: udpPort}}
	r, err := New(Config{Backend: backend, NetNS: top.node, Mark: testMark, IPv6: true, NodeIPs: nodeIPs, Exec: &netfilter.Exec{NetNS: top.node, Variant: variant}, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if r.Backend() != backend {
		t.Fatalf("Backend() = %v, want %v", r.Backend(), backend)
	}
	mustApply(t, r, store(t, services...).Snapshot(), ports, true)
	t.Cleanup(func() {
		if err := r.Cleanup(ctx); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
	})

	from := map[string]string{"node": top.node, "client": top.client}
	tcpCases := []struct {
		from, dst string
		want      string // the original destination the forwarder must read
	}{
		{"node", "198.18.10.1:80", "198.18.10.1:80"},
		{"client", "198.18.10.1:80", "198.18.10.1:80"},
		{"node", "[fd00:10::1]:80", "[fd00:10::1]:80"},
		{"client", "[fd00:10::1]:80", "[fd00:10::1]:80"},
		{"client", node4 + ":30080", node4 + ":30080"},
		{"node", node4 + ":30080", node4 + ":30080"},
		{"node", "127.0.0.1:30080", "127.0.0.1:30080"},
		{"client", node6 + ":30080", node6 + ":30080"},
	}
	for _, tc := range tcpCases {
		t.Run("TCP from "+tc.from+" to "+tc.dst, func(t *testing.T) {
			c, err := kerneltest.Dial(t, from[tc.from], "tcp", tc.dst, 2*time.Second, 0)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer c.Close()
			if got := c.RemoteAddr().String(); got != tc.dst {
				t.Errorf("client sees its peer as %s, want %s", got, tc.dst)
			}
			select {
			case got := <-accepted:
				if got.String() != tc.want {
					t.Errorf("SO_ORIGINAL_DST = %v, want %v", got, tc.want)
				}
			case <-time.After(2 * time.Second):
				t.Fatal("the redirect listener got nothing")
			}
		})
	}

	for _, tc := range []struct{ from, dst string }{
		{"node", "198.18.10.2:80"}, {"client", "198.18.10.2:80"},
		{"node", "[fd00:10::2]:80"}, {"client", "[fd00:10::2]:80"},
		{"client", node4 + ":30082"}, {"node", "127.0.0.1:30082"},
	} {
		t.Run("no endpoints: TCP from "+tc.from+" to "+tc.dst+" refused at once", func(t *testing.T) {
			start := time.Now()
			c, err := kerneltest.Dial(t, from[tc.from], "tcp", tc.dst, 2*time.Second, 0)
			took := time.Since(start)
			if err == nil {
				c.Close()
				t.Fatal("dial succeeded")
			}
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("dial error %v, want connection refused", err)
			}
			if took > 100*time.Millisecond {
				t.Errorf("refused after %v, want under 100ms", took)
			}
		})
	}

	for _, f := range []string{"node", "client"} {
		t.Run("UDP from "+f+": reply comes from the VIP", func(t *testing.T) {
			var c *net.UDPConn
			kerneltest.Do(t, from[f], func() {
				var err error
				if c, err = net.ListenUDP("udp4", nil); err != nil {
					t.Fatal(err)
				}
			})
			defer c.Close()
			vip := ap("198.18.10.53:53")
			for i := range 3 {
				msg := fmt.Sprintf("ping %d", i)
				if _, err := c.WriteToUDPAddrPort([]byte(msg), vip); err != nil {
					t.Fatal(err)
				}
				c.SetReadDeadline(time.Now().Add(2 * time.Second))
				buf := make([]byte, 100)
				n, src, err := c.ReadFromUDPAddrPort(buf)
				if err != nil {
					t.Fatalf("no reply: %v", err)
				}
				if src != vip || string(buf[:n]) != "pong:"+msg {
					t.Errorf("reply %q from %v, want %q from %v", buf[:n], src, "pong:"+msg, vip)
				}
			}
		})
	}

	// The UDP frontend's socket listens on every address of the node (a
	// datagram REDIRECT'ed from another host arrives at the incoming
	// interface's address), but only steered datagrams reach it.
	for _, tc := range []struct{ from, dst string }{
		{"client", node4 + ":40053"}, {"node", node4 + ":40053"}, {"node", "127.0.0.1:40053"},
	} {
		t.Run("UDP from "+tc.from+" straight to the frontend's socket at "+tc.dst+" gets nothing", func(t *testing.T) {
			if reply, err := udpAsk(t, from[tc.from], nil, ap(tc.dst), "direct"); err == nil {
				t.Errorf("got %q back: the socket is reachable without steering", reply)
			}
		})
	}

	t.Run("a UDP frontend moved to another port loses its conntrack entries", func(t *testing.T) {
		var c, moved *net.UDPConn
		kerneltest.Do(t, top.client, func() {
			var err error
			if c, err = net.ListenUDP("udp4", nil); err != nil {
				t.Fatal(err)
			}
		})
		defer c.Close()
		kerneltest.Do(t, top.node, func() {
			var err error
			if moved, err = net.ListenUDP("udp4", &net.UDPAddr{Port: udpPort + 1}); err != nil {
				t.Fatal(err)
			}
		})
		defer moved.Close()
		pktinfoServer(t, moved)
		vip := ap("198.18.10.53:53")
		if _, err := udpAsk(t, "", c, vip, "before"); err != nil {
			t.Fatalf("before the move: %v", err)
		}
		// The old socket goes (as a restarted forwarder's would) and the
		// rules now steer the frontend to the new one: the client's flow,
		// same source port, must follow rather than hit the closed port.
		udp.Close()
		movedPorts := Ports{TCP: testTCPPort, UDP: map[lb.Frontend]uint16{{Protocol: lb.UDP, Addr: vip}: udpPort + 1}}
		mustApply(t, r, store(t, services...).Snapshot(), movedPorts, false)
		if _, err := udpAsk(t, "", c, vip, "after"); err != nil {
			t.Errorf("after the move, the same flow got no reply (conntrack still sends it to the old port): %v", err)
		}
		mustApply(t, r, store(t, services...).Snapshot(), ports, false)
	})

	t.Run("forwarder-marked dials are not steered", func(t *testing.T) {
		for _, dst := range []string{"198.18.10.1:80", "198.18.10.2:80"} {
			c, err := kerneltest.Dial(t, top.node, "tcp4", dst, 300*time.Millisecond, testMark)
			if err == nil {
				c.Close()
				t.Errorf("marked dial to %s connected", dst)
				continue
			}
			if errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("marked dial to %s was rejected by svcproxy's rules: %v", dst, err)
			}
		}
		select {
		case got := <-accepted:
			t.Errorf("a marked dial reached the redirect listener (original destination %v)", got)
		case <-time.After(50 * time.Millisecond):
		}
	})

	t.Run("removed Service is not steered", func(t *testing.T) {
		snap := store(t, services[1:]...).Snapshot()
		mustApply(t, r, snap, ports, false)
		c, err := kerneltest.Dial(t, top.node, "tcp4", "198.18.10.1:80", 300*time.Millisecond, 0)
		if err == nil {
			c.Close()
			t.Fatal("dial to a removed Service connected")
		}
		select {
		case got := <-accepted:
			t.Errorf("the redirect listener got a connection for %v", got)
		case <-time.After(50 * time.Millisecond):
		}
	})
}

// TestPrivilegedLayout logs the kernel rules for a small example (for the
// docs) and checks the rule count does not grow with Services.
func TestPrivilegedLayout(t *testing.T) {
	privileged.Require(t)
	ns := privileged.NewNS(t)
	e := netfilter.NewExec(ns)
	r, err := New(Config{Backend: BackendIPTables, NetNS: ns, Mark: testMark, Exec: e})
	if err != nil {
		t.Fatal(err)
	}
	count := func() int {
		n := 0
		for _, tbl := range []string{"nat", "filter"} {
			out, err := e.IPTablesSave(context.Background(), netfilter.IPv4, tbl)
			if err != nil {
				t.Fatal(err)
			}
			n += strings.Count(string(out), "\n-A ")
		}
		return n
	}
	mustApply(t, r, store(t, testServices()...).Snapshot(), testPorts(), true)
	small := count()
	t.Logf("iptables-save for the example:\n%s", kerneltest.State(t, ns, ""))
	big := testServices()
	for i := range 500 {
		big = append(big, lb.Service{Name: svcName(fmt.Sprintf("x%d", i)), Port: 80, NodePort: uint16(31000 + i),
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 97, byte(i >> 8), byte(i)})}, Endpoints: eps(i%3, "")})
	}
	mustApply(t, r, store(t, big...).Snapshot(), testPorts(), false)
	if got := count(); got != small {
		t.Errorf("%d rules for 505 TCP Services, %d for 5: rules must not grow with TCP Services", got, small)
	}
	if err := r.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// udpAsk sends msg to dst from c, or from a new socket in namespace ns
// when c is nil, and returns the reply, or an error when none comes within
// half a second.
func udpAsk(t *testing.T, ns string, c *net.UDPConn, dst netip.AddrPort, msg string) (string, error) {
	t.Helper()
	if c == nil {
		kerneltest.Do(t, ns, func() {
			var err error
			if c, err = net.ListenUDP("udp4", nil); err != nil {
				t.Fatal(err)
			}
		})
		defer c.Close()
	}
	if _, err := c.WriteToUDPAddrPort([]byte(msg), dst); err != nil {
		return "", err
	}
	c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	buf := make([]byte, 100)
	n, _, err := c.ReadFromUDPAddrPort(buf)
	return string(buf[:n]), err
}
