package firewall_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/firewall"
	"github.com/svcproxy/svcproxy/internal/kerneltest"
	"github.com/svcproxy/svcproxy/internal/topology"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/nftable"
)

// privileged gates the privileged tests: root, and a kernel that takes the
// table with an element in its interval set.
var privileged = kerneltest.Gate{
	Package: "./firewall/",
	Prefix:  "svcproxy-fw-test-",
	Tools:   []string{"ip"},
	Probe: func(ns string) error {
		k := firewall.Netlink(ns)
		ctx := context.Background()
		key := nftable.FrontendKey(netip.MustParseAddr("198.19.0.1"), lb.TCP, 80)
		err := k.Write(ctx, netfilter.IPv4, []nftable.Element{
			{Set: firewall.SetFirewalled, Key: key},
			{Set: firewall.SetAllowed, Key: key + "\x0a\x00\x00\x00", End: key + "\x0a\xff\xff\xff"},
		})
		if err == nil {
			err = k.Delete(ctx, netfilter.IPv4)
		}
		if err != nil {
			return fmt.Errorf("this kernel cannot hold the firewall table (nf_tables with concatenated intervals): %w", err)
		}
		return nil
	},
}

// TestPrivilegedTraffic sends real connections and datagrams from two
// clients to a LoadBalancer IP that only one of them may reach, over both
// families, with a server in the node namespace on every address: what
// serves the LoadBalancer IP does not matter to the firewall.
func TestPrivilegedTraffic(t *testing.T) {
	privileged.Require(t)
	ctx := context.Background()
	top := topology.NewT(t, topology.Options{Backends: -1, Clients: 2})
	node, allowed, denied := top.Node, top.Clients[0], top.Clients[1]
	lbIP, lbIP6 := netip.MustParseAddr("198.19.0.200"), netip.MustParseAddr("fd00:19::200")
	clusterIP := netip.MustParseAddr("198.19.0.10")
	for _, a := range []netip.Addr{lbIP, lbIP6, clusterIP} {
		if err := top.AddNodeAddress(netip.PrefixFrom(a, a.BitLen())); err != nil {
			t.Fatal(err)
		}
	}
	for _, network := range []string{"tcp4", "tcp6"} {
		ln, err := node.Listen(ctx, network, ":80")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Write([]byte("hi"))
				c.Close()
			}
		}()
	}
	udp, err := node.ListenPacket(ctx, "udp4", netip.AddrPortFrom(lbIP, 53).String()) // answers from the address asked
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { udp.Close() })
	go func() {
		b := make([]byte, 64)
		for {
			n, from, err := udp.ReadFrom(b)
			if err != nil {
				return
			}
			udp.WriteTo(b[:n], from)
		}
	}()

	svc := func(proto lb.Protocol, port uint16, ranges ...netip.Prefix) lb.Service {
		return lb.Service{
			Name: lb.ServicePortName{Namespace: "ns", Name: "web", Port: proto.String()}, Protocol: proto, Port: port,
			ClusterIPs: []netip.Addr{clusterIP}, LoadBalancerIPs: []netip.Addr{lbIP, lbIP6},
			LoadBalancerSourceRanges: ranges,
			Endpoints:                []lb.Endpoint{{Addr: netip.AddrPortFrom(topology.NodeAddr, port), Ready: true, Serving: true}},
		}
	}
	only := []netip.Prefix{netip.PrefixFrom(allowed.Addr, 32), netip.PrefixFrom(allowed.Addr6, 128)}
	st := lb.NewStore(lb.StoreOptions{})
	snap, err := st.Replace([]lb.Service{svc(lb.TCP, 80, only...), svc(lb.UDP, 53, only...)})
	if err != nil {
		t.Fatal(err)
	}
	f := firewall.New(firewall.Config{Kernel: firewall.Netlink(node.NS), IPv6: func() bool { return true }})
	t.Cleanup(func() { _ = f.Cleanup(ctx) })
	if err := f.Apply(ctx, snap, true); err != nil {
		t.Fatalf("Apply: %v", err)
	}

	if got := ours(t, node.NS); len(got) != 2 {
		t.Fatalf("firewall tables %v, want ip and ip6", got)
	}

	reaches := func(h *topology.Host, network string, dst netip.Addr, port uint16) bool {
		t.Helper()
		c, err := kerneltest.Dial(t, h.NS, network, netip.AddrPortFrom(dst, port).String(), 300*time.Millisecond, 0)
		if err != nil {
			return false
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(300 * time.Millisecond))
		if network == "udp" {
			if _, err := c.Write([]byte("q")); err != nil {
				return false
			}
		}
		b := make([]byte, 2)
		n, _ := c.Read(b)
		return n > 0
	}
	type reach struct {
		h       *topology.Host
		network string
		dst     netip.Addr
		port    uint16
		want    bool
	}
	check := func(when string, cases []reach) {
		t.Helper()
		for _, c := range cases {
			if got := reaches(c.h, c.network, c.dst, c.port); got != c.want {
				t.Errorf("%s: %s %s → %v:%d reached %v, want %v", when, c.h.Name, c.network, c.dst, c.port, got, c.want)
			}
		}
	}
	type cs = []reach
	check("restricted", cs{
		{allowed, "tcp", lbIP, 80, true},
		{denied, "tcp", lbIP, 80, false},
		{allowed, "tcp", lbIP6, 80, true},
		{denied, "tcp", lbIP6, 80, false},
		{allowed, "udp", lbIP, 53, true},
		{denied, "udp", lbIP, 53, false},
		{denied, "tcp", clusterIP, 80, true}, // ClusterIPs are never restricted
	})

	// Other ranges: the table is rewritten whole, in one transaction.
	other := []netip.Prefix{netip.PrefixFrom(denied.Addr, 32), netip.PrefixFrom(denied.Addr6, 128)}
	if snap, err = st.Replace([]lb.Service{svc(lb.TCP, 80, other...), svc(lb.UDP, 53, other...)}); err != nil {
		t.Fatal(err)
	}
	if err := f.Apply(ctx, snap, false); err != nil {
		t.Fatal(err)
	}
	check("other ranges", cs{
		{allowed, "tcp", lbIP, 80, false},
		{denied, "tcp", lbIP, 80, true},
		{allowed, "tcp", lbIP6, 80, false},
		{denied, "tcp", lbIP6, 80, true},
		{allowed, "udp", lbIP, 53, false},
		{denied, "udp", lbIP, 53, true},
	})

	// The ranges go: so does the table, and everyone gets through.
	if snap, err = st.Replace([]lb.Service{svc(lb.TCP, 80), svc(lb.UDP, 53)}); err != nil {
		t.Fatal(err)
	}
	if err := f.Apply(ctx, snap, false); err != nil {
		t.Fatal(err)
	}
	check("open", cs{
		{denied, "tcp", lbIP, 80, true},
		{denied, "tcp", lbIP6, 80, true},
		{denied, "udp", lbIP, 53, true},
	})
	if got := ours(t, node.NS); len(got) != 0 {
		t.Errorf("%v still there with no ranges", got)
	}
}

// ours lists the firewall tables in namespace ns.
func ours(t *testing.T, ns string) []string {
	t.Helper()
	tables, err := nftable.ListTables(ns)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, tb := range tables {
		if tb == "table ip "+firewall.Table || tb == "table ip6 "+firewall.Table {
			out = append(out, tb)
		}
	}
	return out
}
