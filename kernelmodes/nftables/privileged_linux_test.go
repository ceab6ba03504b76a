package nftables_test

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/internal/kerneltest"
	"github.com/svcproxy/svcproxy/internal/topology"
	"github.com/svcproxy/svcproxy/kernelmodes/nftables"
	"github.com/svcproxy/svcproxy/lb"
)

// privileged gates the privileged tests: root, and a kernel that takes
// the mode's whole layout (Available, in a throwaway namespace).
var privileged = kerneltest.Gate{
	Package: "./kernelmodes/nftables/",
	Prefix:  "svcproxy-nft-test-",
	Tools:   []string{"ip", "nft"},
	Probe: func(ns string) error {
		m, err := nftables.New(nftables.Config{IPv6: true, NetNS: ns})
		if err == nil {
			err = m.Available(context.Background())
		}
		if err != nil {
			return fmt.Errorf("this kernel cannot run the nftables mode: %w", err)
		}
		return nil
	},
}

func nftList(t *testing.T, ns string) string {
	return kerneltest.Run(t, "ip", "netns", "exec", ns, "nft", "list", "ruleset")
}

// TestPrivilegedTraffic sends real connections and datagrams through the
// table in a topology: a client ("pod" on another node) and two backends
// ("pods" on this node) routed through the node namespace, which runs the
// mode. Then it tampers with the table and sees it repaired, and cleans up.
func TestPrivilegedTraffic(t *testing.T) {
	privileged.Require(t)
	ctx := context.Background()
	top := topology.NewT(t, topology.Options{Backends: 2, Clients: 1})
	kerneltest.Run(t, "ip", "-n", top.Node.NS, "route", "add", topology.FreeRange.String(), "dev", "lo")
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
		{Name: name("web"), Port: 80, NodePort: 30080, Endpoints: []lb.Endpoint{ep(b0, nodeName), ep(b1, nodeName)},
			ClusterIPs: []netip.Addr{vip(10)}, ExternalIPs: []netip.Addr{vip(100)}, LoadBalancerIPs: []netip.Addr{vip(200)}},
		{Name: name("dead"), Port: 80, NodePort: 30082, ClusterIPs: []netip.Addr{vip(12)}},
		{Name: name("dead-udp"), Protocol: lb.UDP, Port: 53, ClusterIPs: []netip.Addr{vip(13)}},
		{Name: name("local"), Port: 80, NodePort: 30081, ExternalTrafficPolicy: lb.PolicyLocal,
			Endpoints:  []lb.Endpoint{ep(b0, nodeName), ep(b1, "node-b")},
			ClusterIPs: []netip.Addr{vip(11)}, ExternalIPs: []netip.Addr{vip(101)}},
		{Name: name("dns"), Protocol: lb.UDP, Port: 53, NodePort: 30053, Endpoints: []lb.Endpoint{ep(b0, nodeName), ep(b1, nodeName)},
			ClusterIPs: []netip.Addr{vip(53)}},
		{Name: name("sticky"), Port: 80, NodePort: 30085, AffinityTimeout: time.Minute, Endpoints: []lb.Endpoint{ep(b0, nodeName), ep(b1, nodeName)},
			ClusterIPs: []netip.Addr{vip(15)}},
	}
	st := lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: nodeName}})
	snap := snapshot(t, st, services)
	m, err := nftables.New(nftables.Config{NetNS: node.NS, Logger: zaptest.NewLogger(t), FullSyncPeriod: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Available(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Apply(ctx, snap, true); err != nil {
		t.Fatalf("Apply: %v\n%s", err, nftList(t, node.NS))
	}
	cleaned := false
	t.Cleanup(func() {
		if !cleaned {
			_ = m.Cleanup(ctx)
		}
	})

	nodeAddr := topology.NodeAddr.String()
	hosts := map[string]*topology.Host{"node": node, "client": client, "backend0": b0}
	serves := func(t *testing.T, from, network, dst string, backends []string, peerKind string) {
		t.Helper()
		topology.Spread(t, hosts[from], network, dst, backends, func(name string) string {
			if peerKind == "hairpin" && name == "backend0" {
				return nodeAddr // itself, masqueraded: it sees the node
			}
			return map[string]string{"client": client.Addr.String(), "node": nodeAddr, "hairpin": b0.Addr.String()}[peerKind]
		})
	}

	both := []string{"backend0", "backend1"}
	for _, tc := range []struct {
		from, network, dst string
		backends           []string
		peer               string // the source the backend sees: "client", "node" (masqueraded) or "hairpin"
	}{
		{"client", "tcp4", "198.19.0.10:80", both, "client"},
		{"node", "tcp4", "198.19.0.10:80", both, "node"},
		{"client", "tcp4", "198.19.0.100:80", both, "node"}, // ExternalIP, Cluster: masqueraded
		{"client", "tcp4", "198.19.0.200:80", both, "node"}, // LoadBalancer IP
		{"client", "tcp4", nodeAddr + ":30080", both, "node"},
		{"node", "tcp4", nodeAddr + ":30080", both, "node"},
		{"client", "tcp4", nodeAddr + ":30081", []string{"backend0"}, "client"}, // Local: client address kept
		{"client", "tcp4", "198.19.0.101:80", []string{"backend0"}, "client"},   // Local ExternalIP
		{"node", "tcp4", nodeAddr + ":30081", both, "node"},                     // Local, from the node: short-circuited, masqueraded
		{"node", "tcp4", "198.19.0.101:80", both, "node"},
		{"client", "tcp4", "198.19.0.11:80", both, "client"},
		{"client", "udp4", "198.19.0.53:53", both, "client"},
		{"node", "udp4", "198.19.0.53:53", both, "node"},
		{"client", "udp4", nodeAddr + ":30053", both, "node"},
		{"backend0", "tcp4", "198.19.0.10:80", both, "hairpin"}, // reaching itself works: masqueraded
	} {
		t.Run(fmt.Sprintf("%s %s from %s", tc.network, tc.dst, tc.from), func(t *testing.T) {
			serves(t, tc.from, tc.network, tc.dst, tc.backends, tc.peer)
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

	t.Run("an endpoint change is one small transaction that traffic follows", func(t *testing.T) {
		svcs := slices.Clone(services)
		svcs[0].Endpoints = svcs[0].Endpoints[1:]
		start := time.Now()
		if err := m.Apply(ctx, snapshot(t, st, svcs), false); err != nil {
			t.Fatal(err)
		}
		t.Logf("applied in %v", time.Since(start))
		serves(t, "client", "tcp4", "198.19.0.10:80", []string{"backend1"}, "client")
		if err := m.Apply(ctx, snapshot(t, st, services), false); err != nil {
			t.Fatal(err)
		}
		serves(t, "client", "tcp4", "198.19.0.10:80", both, "client")
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
			if _, err := c.Write([]byte("q")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 100)
			n, err := c.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			return strings.Fields(string(buf[:n]))[0]
		}
		first := askUDP()
		svcs := slices.Clone(services)
		keep := b0
		if first == "backend0" {
			keep = b1
		}
		svcs[4].Endpoints = []lb.Endpoint{ep(keep, nodeName)}
		if err := m.Apply(ctx, snapshot(t, st, svcs), false); err != nil {
			t.Fatal(err)
		}
		if got := askUDP(); got != keep.Name {
			t.Errorf("the same flow after its endpoint %s left: answered by %s, want %s", first, got, keep.Name)
		}
		if err := m.Apply(ctx, snapshot(t, st, services), false); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("affinity sticks, and moves off a removed endpoint", func(t *testing.T) {
		for _, dst := range []string{"198.19.0.15:80", nodeAddr + ":30085"} {
			first, _, err := topology.Ask(client, "tcp4", dst, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			for range 20 {
				got, _, err := topology.Ask(client, "tcp4", dst, 2*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if got != first {
					t.Fatalf("%s: first %s, then %s", dst, first, got)
				}
			}
		}
		first, _, _ := topology.Ask(client, "tcp4", "198.19.0.15:80", 2*time.Second)
		keep := b0
		if first == "backend0" {
			keep = b1
		}
		svcs := slices.Clone(services)
		svcs[5].Endpoints = []lb.Endpoint{ep(keep, nodeName)}
		if err := m.Apply(ctx, snapshot(t, st, svcs), false); err != nil {
			t.Fatal(err)
		}
		if got, _, err := topology.Ask(client, "tcp4", "198.19.0.15:80", 2*time.Second); err != nil || got != keep.Name {
			t.Errorf("after %s left: %s, %v; want %s", first, got, err, keep.Name)
		}
		svcs[5].Endpoints = services[5].Endpoints
		if err := m.Apply(ctx, snapshot(t, st, svcs), false); err != nil {
			t.Fatal(err)
		}
		for range 10 { // it stays with the endpoint it moved to
			if got, _, err := topology.Ask(client, "tcp4", "198.19.0.15:80", 2*time.Second); err != nil || got != keep.Name {
				t.Fatalf("after %s came back: %s, %v; want %s still", first, got, err, keep.Name)
			}
		}
	})

	t.Run("tampering is repaired", func(t *testing.T) {
		for _, cmd := range [][]string{
			{"flush", "map", "ip", nftables.Table, nftables.SetServiceEndpoints},
			{"delete", "table", "ip", nftables.Table},
		} {
			kerneltest.Run(t, "ip", append([]string{"netns", "exec", node.NS, "nft"}, cmd...)...)
			before := m.Repairs()
			if err := m.Apply(ctx, snapshot(t, st, services), true); err != nil {
				t.Fatal(err)
			}
			if m.Repairs() != before+1 {
				t.Errorf("nft %s: Repairs() = %d, want %d", strings.Join(cmd, " "), m.Repairs(), before+1)
			}
			serves(t, "client", "tcp4", "198.19.0.10:80", both, "client")
		}
	})

	cleaned = true
	if err := m.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if out := nftList(t, node.NS); strings.Contains(out, "table ip "+nftables.Table) {
		t.Errorf("after Cleanup:\n%s", out)
	}
}

// countElements counts the elements of every set of the IPv4 table in ns.
func countElements(ns string) (int, error) {
	k := 0
	for _, set := range nftables.Sets {
		out, err := exec.Command("ip", "netns", "exec", ns, "nft", "-j", "list", "set", "ip", nftables.Table, set).Output()
		if err != nil {
			out, err = exec.Command("ip", "netns", "exec", ns, "nft", "-j", "list", "map", "ip", nftables.Table, set).Output()
		}
		if err != nil {
			return 0, fmt.Errorf("listing %s: %w", set, err)
		}
		if nftables.IsMap(set) && set != nftables.SetServiceSlots && set != nftables.SetNodePortSlots { // a verdict is no concat
			k += strings.Count(string(out), `"concat"`) / 2
		} else {
			k += strings.Count(string(out), `"concat"`)
		}
	}
	return k, nil
}

// TestPrivilegedShortCircuit: pods (--cluster-cidr) and the node reach
// every endpoint of a Service with externalTrafficPolicy Local at its
// external frontends; a client outside the cluster this node's alone
// (kerneltest.ShortCircuit).
func TestPrivilegedShortCircuit(t *testing.T) {
	privileged.Require(t)
	kerneltest.ShortCircuit(t, nodeName, func(node *topology.Host, cidr netip.Prefix, services []lb.Service) {
		m, err := nftables.New(nftables.Config{NetNS: node.NS, ClusterCIDRs: []netip.Prefix{cidr}, Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Apply(context.Background(), snapshot(t, lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: nodeName}}), services), true); err != nil {
			t.Fatalf("Apply: %v\n%s", err, nftList(t, node.NS))
		}
	})
}
