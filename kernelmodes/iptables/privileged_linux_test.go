//go:build linux

package iptables

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/internal/kerneltest"
	"github.com/svcproxy/svcproxy/internal/topology"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
)

// privileged gates the privileged tests: root, the tools, and a kernel
// with what the mode needs (Available, in a throwaway namespace).
var privileged = kerneltest.Gate{
	Package: "./kernelmodes/iptables/",
	Prefix:  "svcproxy-dnat-test-",
	Tools:   []string{"ip", "iptables", "iptables-restore", "iptables-save", "ip6tables-restore", "ip6tables-save", "ipset"},
	Probe: func(ns string) error {
		m, err := New(Config{IPv6: true, Exec: netfilter.NewExec(ns)})
		if err == nil {
			err = m.Available(context.Background())
		}
		if err != nil {
			return fmt.Errorf("this kernel or these tools cannot run the DNAT mode: %w", err)
		}
		return nil
	},
}

// ownState is this mode's chains in a namespace (or a Fake's dump), one
// "-A" line each, sorted, and its set members: what fake-vs-kernel parity
// compares.
func ownState(dump string) string {
	var lines []string
	for line := range strings.Lines(dump) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "-A ") && strings.Contains(line, chainPrefix) ||
			strings.HasPrefix(line, "add "+setPrefix) {
			lines = append(lines, line)
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// foreignRules make the tables exist (so before/after comparisons see them
// on nf_tables too) and must survive everything.
var foreignRules = map[netfilter.Family]string{
	netfilter.IPv4: "*nat\n:FOREIGN - [0:0]\n-A PREROUTING -s 203.0.113.0/24 -j FOREIGN\n-A FOREIGN -p tcp -m tcp --dport 8080 -j REDIRECT --to-ports 9090\n-A POSTROUTING -o eth9 -j MASQUERADE\nCOMMIT\n" +
		"*filter\n-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\n-A FORWARD -m set --match-set foreign-set src -j DROP\nCOMMIT\n",
	netfilter.IPv6: "*nat\n-A OUTPUT -d 2001:db8::1/128 -j RETURN\nCOMMIT\n*filter\n-A INPUT -p udp -m udp --dport 546 -j ACCEPT\nCOMMIT\n",
}

// TestPrivilegedApplyCleanup programs the example for real in both
// families: what iptables-save shows is what the Fake holds (parity), a
// full sync finds exactly what it wrote, tampering is repaired and counted,
// and Cleanup leaves the tables as they were.
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

			cfg := Config{IPv6: true, ClusterCIDRs: []netip.Prefix{podCIDR},
				NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/24"), netip.MustParsePrefix("2001:db8::/64")}}
			cfg.Exec, cfg.Logger = e, zaptest.NewLogger(t)
			m, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			wantBackend := map[string]string{"": "nf_tables", "legacy": "legacy"}[variant]
			if m.Backend() != wantBackend {
				t.Errorf("Backend() = %q, want %q", m.Backend(), wantBackend)
			}
			if err := m.Available(ctx); err != nil {
				t.Fatal(err)
			}
			if after := kerneltest.State(t, ns, variant); after != before {
				t.Errorf("Available left:\n%s", after)
			}
			st := store(t, testServices()...)
			mustApply(t, m, st.Snapshot(), true)
			state := kerneltest.State(t, ns, variant)
			t.Logf("after the first Apply:\n%s", state)

			// Fake-vs-kernel parity: the same Apply on the Fake holds the
			// same rules and members.
			fcfg := cfg
			fake := netfiltertest.NewFake()
			fcfg.Exec = fake
			fm, err := New(fcfg)
			if err != nil {
				t.Fatal(err)
			}
			mustApply(t, fm, st.Snapshot(), true)
			if got, want := ownState(state), ownState(fake.Dump()); got != want {
				t.Errorf("kernel:\n%s\nFake:\n%s", got, want)
			}

			// A full sync finds exactly what it wrote: the canonical rule
			// text agrees with this iptables-save.
			mustApply(t, m, st.Snapshot(), true)
			if m.Repairs() != 0 {
				t.Fatalf("Repairs = %d after an untouched full sync: what svcproxy writes and what iptables-save shows disagree", m.Repairs())
			}
			svcs := testServices()
			svcs[3].Endpoints = eps(7, 1, "")
			svcs[0].Endpoints = svcs[0].Endpoints[1:]
			added := lb.Service{Name: svcName("added"), Port: 443, ClusterIPs: []netip.Addr{ip("10.96.1.1"), ip("fd00::1:1")}, Endpoints: slices.Concat(eps(9, 3, ""), eps6(9, 1, ""))}
			snap, _ := st.Update([]lb.Service{svcs[3], svcs[0], added}, []lb.ServicePortName{svcName("sticky")})
			mustApply(t, m, snap, false)
			snap, _ = st.Update(nil, []lb.ServicePortName{svcName("added")})
			mustApply(t, m, snap, false)
			mustApply(t, m, snap, true)
			if m.Repairs() != 0 {
				t.Fatalf("Repairs = %d after incremental syncs", m.Repairs())
			}

			// Tamper with the real thing.
			webChain := chainName(kindService, &svcs[0], netip.AddrPort{})
			kerneltest.Run(t, "ip", "netns", "exec", ns, e.Tool(netfilter.IPv4, ""), "-t", "nat", "-F", webChain)
			kerneltest.Run(t, "ip", "netns", "exec", ns, e.Tool(netfilter.IPv6, ""), "-t", "filter", "-D", "INPUT", "-j", chainFilter)
			kerneltest.Run(t, "ip", "netns", "exec", ns, e.Tool(netfilter.IPv4, ""), "-t", "nat", "-D", chainServices, "-d", "10.96.0.11/32", "-p", "tcp", "-m", "tcp", "--dport", "80", "-j", chainName(kindService, &svcs[1], netip.AddrPort{}))
			kerneltest.Run(t, "ip", "netns", "exec", ns, "ipset", "del", hairpinSet(netfilter.IPv4), "10.244.1.2,tcp:8080,10.244.1.2")
			kerneltest.Run(t, "ip", "netns", "exec", ns, "ipset", "create", setPrefix+"old", "hash:ip,port")
			if err := e.IPTablesRestore(ctx, netfilter.IPv4, []byte("*nat\n:SVCPROXY-DNAT-OLD - [0:0]\n"+
				"-A SVCPROXY-DNAT-OLD -m set --match-set svcproxy-dnat-old dst,dst -m comment --comment \"old svcproxy\" -j RETURN\n"+
				"-I PREROUTING 1 -m comment --comment \"old svcproxy\" -s 10.0.0.0/8 -j SVCPROXY-DNAT-OLD\n"+
				"-A OUTPUT -p tcp -j "+chainServices+"\nCOMMIT\n")); err != nil {
				t.Fatalf("leaving stray rules: %v", err)
			}
			tampered := kerneltest.State(t, ns, variant)
			mustApply(t, m, snap, true)
			if m.Repairs() != 1 {
				t.Errorf("Repairs = %d after tampering, want 1", m.Repairs())
			}
			mustApply(t, m, snap, true)
			if m.Repairs() != 1 {
				t.Errorf("Repairs = %d after a clean full sync, want 1", m.Repairs())
			}
			repaired := kerneltest.State(t, ns, variant)
			if repaired == tampered {
				t.Errorf("the repair changed nothing")
			}
			if strings.Contains(repaired, "-old") || strings.Contains(repaired, "OLD") || strings.Contains(repaired, "-A OUTPUT -p tcp -j SVCPROXY") {
				t.Errorf("the repair left stray rules or sets:\n%s", repaired)
			}

			if err := m.Cleanup(ctx); err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			if after := kerneltest.State(t, ns, variant); after != before {
				t.Errorf("after Cleanup:\n%s\nbefore the first Apply:\n%s", after, before)
			}
		})
	}
}

// TestPrivilegedTraffic sends real connections and datagrams through the
// rules in a topology: a client ("pod" on another node) and two backend
// namespaces ("pods" on this node) routed through the node namespace, which
// runs the mode.
func TestPrivilegedTraffic(t *testing.T) {
	privileged.Require(t)
	for _, variant := range kerneltest.Variants() {
		t.Run(kerneltest.VariantName(variant), func(t *testing.T) { testTraffic(t, variant) })
	}
}

// serviceTopology is a client, the node and two backends, the node
// routing the Service IP range to itself: its own connections to Service
// IPs need a route for nat OUTPUT to see them.
func serviceTopology(t *testing.T) *topology.Topology {
	top := topology.NewT(t, topology.Options{Backends: 2, Clients: 1})
	kerneltest.Run(t, "ip", "-n", top.Node.NS, "route", "add", topology.FreeRange.String(), "dev", "lo")
	return top
}

func testTraffic(t *testing.T, variant string) {
	ctx := context.Background()
	top := serviceTopology(t)
	node, client := top.Node, top.Clients[0]
	b0, b1 := top.Backends[0], top.Backends[1]
	for _, b := range top.Backends {
		topology.ServeNames(t, b)
	}
	ep := func(h *topology.Host, node string) lb.Endpoint {
		return lb.Endpoint{Addr: netip.AddrPortFrom(h.Addr, 8080), Ready: true, Serving: true, NodeName: node}
	}
	vip := func(last byte) netip.Addr { return netip.AddrFrom4([4]byte{198, 19, 0, last}) }
	services := []lb.Service{
		{Name: svcName("web"), Port: 80, NodePort: 30080, Endpoints: []lb.Endpoint{ep(b0, nodeName), ep(b1, nodeName)},
			ClusterIPs: []netip.Addr{vip(10)}, ExternalIPs: []netip.Addr{vip(100)}, LoadBalancerIPs: []netip.Addr{vip(200)}},
		{Name: svcName("dead"), Port: 80, NodePort: 30082, ClusterIPs: []netip.Addr{vip(12)}},
		{Name: svcName("dead-udp"), Protocol: lb.UDP, Port: 53, ClusterIPs: []netip.Addr{vip(13)}},
		{Name: svcName("local"), Port: 80, NodePort: 30081, ExternalTrafficPolicy: lb.PolicyLocal,
			Endpoints:  []lb.Endpoint{ep(b0, nodeName), ep(b1, "node-b")},
			ClusterIPs: []netip.Addr{vip(11)}, ExternalIPs: []netip.Addr{vip(101)}},
		{Name: svcName("sticky"), Port: 80, AffinityTimeout: time.Minute, Endpoints: []lb.Endpoint{ep(b0, nodeName), ep(b1, nodeName)},
			ClusterIPs: []netip.Addr{vip(15)}},
		{Name: svcName("dns"), Protocol: lb.UDP, Port: 53, NodePort: 30053, Endpoints: []lb.Endpoint{ep(b0, nodeName), ep(b1, nodeName)},
			ClusterIPs: []netip.Addr{vip(53)}},
	}
	st := store(t, services...)
	m, err := New(Config{Exec: &netfilter.Exec{NetNS: node.NS, Variant: variant}, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Available(ctx); err != nil {
		t.Fatal(err)
	}
	mustApply(t, m, st.Snapshot(), true)
	t.Cleanup(func() {
		if err := m.Cleanup(ctx); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
	})

	nodeAddr := topology.NodeAddr.String()
	hosts := map[string]*topology.Host{"node": node, "client": client, "backend0": b0}
	for _, tc := range []struct {
		from, network, dst string
		backends           []string // who may answer; every one must, over 40 tries
		peer               string   // the source the backend must see: "client", "node" (masqueraded) or "self"
	}{
		{"client", "tcp4", "198.19.0.10:80", []string{"backend0", "backend1"}, "client"},
		{"node", "tcp4", "198.19.0.10:80", []string{"backend0", "backend1"}, "node"},
		{"client", "tcp4", "198.19.0.100:80", []string{"backend0", "backend1"}, "node"}, // ExternalIP, Cluster: masqueraded
		{"client", "tcp4", "198.19.0.200:80", []string{"backend0", "backend1"}, "node"}, // LoadBalancer IP
		{"client", "tcp4", nodeAddr + ":30080", []string{"backend0", "backend1"}, "node"},
		{"node", "tcp4", nodeAddr + ":30080", []string{"backend0", "backend1"}, "node"},
		{"client", "tcp4", nodeAddr + ":30081", []string{"backend0"}, "client"}, // Local: client address kept
		{"client", "tcp4", "198.19.0.101:80", []string{"backend0"}, "client"},   // Local ExternalIP
		// Local, from the node: short-circuited to every endpoint, masqueraded.
		{"node", "tcp4", nodeAddr + ":30081", []string{"backend0", "backend1"}, "node"},
		{"node", "tcp4", "198.19.0.101:80", []string{"backend0", "backend1"}, "node"},
		{"client", "tcp4", "198.19.0.11:80", []string{"backend0", "backend1"}, "client"},
		{"client", "udp4", "198.19.0.53:53", []string{"backend0", "backend1"}, "client"},
		{"node", "udp4", "198.19.0.53:53", []string{"backend0", "backend1"}, "node"},
		{"client", "udp4", nodeAddr + ":30053", []string{"backend0", "backend1"}, "node"},
		{"backend0", "tcp4", "198.19.0.10:80", []string{"backend0", "backend1"}, "hairpin"}, // reaching itself works: masqueraded
	} {
		t.Run(fmt.Sprintf("%s %s from %s", tc.network, tc.dst, tc.from), func(t *testing.T) {
			topology.Spread(t, hosts[tc.from], tc.network, tc.dst, tc.backends, func(name string) string {
				if tc.peer == "hairpin" && name == "backend0" {
					return nodeAddr // itself, masqueraded: it sees the node
				}
				return map[string]string{"client": client.Addr.String(), "node": nodeAddr, "hairpin": b0.Addr.String()}[tc.peer]
			})
		})
	}

	for _, tc := range []struct{ from, network, dst string }{
		{"client", "tcp4", "198.19.0.12:80"}, {"node", "tcp4", "198.19.0.12:80"},
		{"client", "tcp4", nodeAddr + ":30082"}, {"node", "tcp4", nodeAddr + ":30082"},
		{"client", "udp4", "198.19.0.13:53"},
	} {
		t.Run(fmt.Sprintf("no endpoints: %s %s from %s refused at once", tc.network, tc.dst, tc.from), func(t *testing.T) {
			topology.Refused(t, hosts[tc.from], tc.network, tc.dst)
		})
	}

	t.Run("affinity sticks", func(t *testing.T) {
		first, _, err := topology.Ask(client, "tcp4", "198.19.0.15:80", 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for range 20 {
			name, _, err := topology.Ask(client, "tcp4", "198.19.0.15:80", 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if name != first {
				t.Fatalf("first %s, then %s", first, name)
			}
		}
	})

	t.Run("a UDP flow moves off a removed endpoint", func(t *testing.T) {
		c, err := client.Dial(ctx, "udp4", "198.19.0.53:53")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		askUDP := func() string {
			t.Helper()
			c.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := c.Write([]byte("hi")); err != nil {
				t.Fatal(err)
			}
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			return strings.Fields(line)[0]
		}
		first := askUDP()
		for range 5 {
			if got := askUDP(); got != first {
				t.Fatalf("one flow answered by %s, then %s: conntrack keeps a flow on its endpoint", first, got)
			}
		}
		dns := services[5]
		dns.Endpoints = slices.DeleteFunc(slices.Clone(dns.Endpoints), func(e lb.Endpoint) bool {
			return (first == "backend0") == (e.Addr.Addr() == b0.Addr)
		})
		snap, err := st.Update([]lb.Service{dns}, nil)
		if err != nil {
			t.Fatal(err)
		}
		mustApply(t, m, snap, false)
		if got := askUDP(); got == first {
			t.Errorf("the flow still goes to %s after it was removed", got)
		}
	})

	t.Run("endpoint removal", func(t *testing.T) {
		web := services[0]
		web.Endpoints = web.Endpoints[1:]
		snap, err := st.Update([]lb.Service{web}, nil)
		if err != nil {
			t.Fatal(err)
		}
		mustApply(t, m, snap, false)
		for range 20 {
			name, _, err := topology.Ask(client, "tcp4", "198.19.0.10:80", 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if name != "backend1" {
				t.Fatalf("answered by %s after it was removed", name)
			}
		}
	})

	t.Run("removed Service is not forwarded", func(t *testing.T) {
		snap, err := st.Update(nil, []lb.ServicePortName{svcName("web")})
		if err != nil {
			t.Fatal(err)
		}
		mustApply(t, m, snap, false)
		if name, _, err := topology.Ask(client, "tcp4", "198.19.0.10:80", 300*time.Millisecond); err == nil {
			t.Fatalf("a removed Service answered (%s)", name)
		}
		if name, _, err := topology.Ask(client, "tcp4", nodeAddr+":30080", 300*time.Millisecond); err == nil {
			t.Fatalf("a removed NodePort answered (%s)", name)
		}
		// The others still work.
		if _, _, err := topology.Ask(client, "tcp4", "198.19.0.11:80", 2*time.Second); err != nil {
			t.Fatal(err)
		}
	})
}

// TestPrivilegedShortCircuit: pods (--cluster-cidr) and the node reach
// every endpoint of a Service with externalTrafficPolicy Local at its
// external frontends; a client outside the cluster this node's alone
// (kerneltest.ShortCircuit), on both iptables backends.
func TestPrivilegedShortCircuit(t *testing.T) {
	privileged.Require(t)
	for _, variant := range kerneltest.Variants() {
		t.Run(kerneltest.VariantName(variant), func(t *testing.T) {
			kerneltest.ShortCircuit(t, nodeName, func(node *topology.Host, cidr netip.Prefix, services []lb.Service) {
				m, err := New(Config{Exec: &netfilter.Exec{NetNS: node.NS, Variant: variant}, ClusterCIDRs: []netip.Prefix{cidr}, Logger: zaptest.NewLogger(t)})
				if err != nil {
					t.Fatal(err)
				}
				mustApply(t, m, store(t, services...).Snapshot(), true)
			})
		})
	}
}
