package iptables

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"testing"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/conntrack/conntracktest"
	"github.com/svcproxy/svcproxy/internal/kerneltest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
)

// fuzzEndpoints are shared between the fuzzed Services.
var fuzzEndpoints = []netip.AddrPort{
	ap("10.244.0.1:8080"), ap("10.244.0.2:8080"), ap("10.244.0.3:9090"), ap("10.244.1.1:8080"),
	ap("[fd00:244::1]:8080"), ap("[fd00:244::2]:8080"),
}

// expect computes, straight from the snapshot and the configuration, where
// p may go: untouched, rejected, or spread over the pool's endpoints of
// p's family, masqueraded as kube-proxy would.
func expect(snap *lb.Snapshot, m *Mode, p netfiltertest.Packet) want {
	cfg := m.cfg
	dst := p.Dst
	fam := familyOf(dst.Addr())
	if fam == netfilter.IPv6 && !cfg.IPv6 {
		return accepted
	}
	var pool *lb.Pool
	for _, b := range snap.Balancers() {
		s := b.Service
		if s.Protocol == p.Proto && s.Port == dst.Port() &&
			slices.Contains(slices.Concat(s.ClusterIPs, s.ExternalIPs, s.LoadBalancerIPs), dst.Addr()) {
			pool = snap.Route(p.Proto, dst)
		}
	}
	if pool == nil {
		local := slices.Contains(p.LocalAddrs, dst.Addr()) // never loopback in this mode
		allowed := true
		if len(cfg.NodePortAddresses) > 0 {
			allowed = false
			for _, pfx := range cfg.NodePortAddresses {
				if familyOf(pfx.Addr()) == fam && (pfx.Bits() == 0 || pfx.Contains(dst.Addr())) {
					allowed = true
				}
			}
		}
		if !local || !allowed {
			return accepted
		}
		for _, b := range snap.Balancers() {
			if b.Service.Protocol == p.Proto && b.Service.NodePort == dst.Port() {
				pool = snap.Route(p.Proto, netip.AddrPortFrom(netip.IPv4Unspecified(), dst.Port()))
			}
		}
		if pool == nil {
			return accepted
		}
	}
	inFamily := func(pool *lb.Pool) []string {
		var eps []string
		for _, b := range pool.Backends() {
			if familyOf(b.Addr.Addr()) == fam {
				eps = append(eps, b.Addr.String())
			}
		}
		return eps
	}
	// The short circuit: the node (masqueraded) and pods reaching an
	// external frontend of a Local Service get the Cluster endpoints.
	node := p.Src.Addr().IsLoopback() || slices.Contains(p.LocalAddrs, p.Src.Addr())
	pod := m.clusterCIDR[fam].IsValid() && m.clusterCIDR[fam].Contains(p.Src.Addr())
	if sc := pool.ShortCircuit(); sc != nil && (node || pod) && len(inFamily(sc)) > 0 {
		return spread(node, inFamily(sc)...)
	}
	eps := inFamily(pool)
	if len(eps) == 0 {
		return rejected
	}
	// MasqueradeAll is kube-proxy's: traffic sent to ClusterIPs only.
	var masq bool
	if pool.External {
		masq = pool.Service.ExternalTrafficPolicy == lb.PolicyCluster
	} else {
		c := m.clusterCIDR[fam]
		masq = cfg.MasqueradeAll || c.IsValid() && !c.Contains(p.Src.Addr())
	}
	return spread(masq, eps...)
}

// fuzzPackets are the packets worth tracing for services.
func fuzzPackets(services []lb.Service) []netfiltertest.Packet {
	var pkts []netfiltertest.Packet
	for _, d := range kerneltest.Destinations(services, nodeIP, nodeIP2, nodeIP6) {
		for _, proto := range []lb.Protocol{lb.TCP, lb.UDP, lb.SCTP} {
			for _, hook := range []netfiltertest.Hook{pre, out} {
				if d.Addr().IsLoopback() && hook == pre {
					continue
				}
				p := pkt(proto, d.String(), hook)
				pkts = append(pkts, p)
				if hook == pre {
					// An endpoint (hairpin), and a client outside the cluster.
					src := "10.244.0.1:5000"
					if d.Addr().Is6() {
						src = "[fd00:244::1]:5000"
					}
					pkts = append(pkts, from(p, src))
					if d.Addr().Is4() {
						pkts = append(pkts, from(p, "192.0.2.200:5000"))
					}
				}
			}
		}
	}
	return pkts
}

// checkOutcomes fails t unless p goes where w says; an outcome that sends a
// pod to itself is masqueraded too (hairpin), whatever w says.
func checkOutcomes(t *testing.T, f *netfiltertest.Fake, p netfiltertest.Packet, w want, context string) {
	got := f.TraceAll(p)
	fail := func() {
		t.Fatalf("%s: %v %v -> %v via %v: got %v, want %v\n%s", context, p.Proto, p.Src, p.Dst, p.Hook, got, w, f.Dump())
	}
	if w.action != netfiltertest.DNAT {
		if len(got) != 1 || got[0].Action != w.action || got[0].Masquerade {
			fail()
		}
		return
	}
	if len(got) != len(w.eps) {
		fail()
	}
	wantEps := slices.Clone(w.eps)
	slices.SortFunc(wantEps, func(a, b string) int { return ap(a).Compare(ap(b)) })
	for i, o := range got {
		masq := w.masq || o.Dst.Addr() == p.Src.Addr()
		if o.Action != netfiltertest.DNAT || o.Dst != ap(wantEps[i]) || o.Masquerade != masq ||
			math.Abs(o.Probability-1/float64(len(w.eps))) > 1e-6 {
			fail()
		}
	}
}

func FuzzApply(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{3, 1, 0, 1, 0, 1, 1, 2, 0, 3, 1, 1, 2, 7, 7, 0, 0, 1, 1, 0, 1, 1, 0, 2, 2, 1, 6, 2, 0, 1})
	f.Add([]byte{6, 0, 1, 1, 3, 1, 0, 2, 4, 5, 1, 4, 1, 5, 2, 6, 7, 1, 0, 1, 2, 3, 0, 1, 1, 2, 1, 0, 0, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17})
	f.Add([]byte{5, 2, 1, 1, 1, 1, 0, 1, 4, 1, 1, 0, 1, 7, 3, 1, 1, 1, 1, 1, 0, 1, 0, 2, 6, 4, 1, 1, 1, 1, 1, 1, 2, 7, 7, 2, 1, 0, 3, 1, 1})
	// A Local Service whose two ready endpoints are on another node, with
	// a ClusterIP and an ExternalIP, under ClusterCIDRs: the short circuit.
	f.Add([]byte{4, 0, 1, 0, 0, 0, 0, 1, 0, 1, 1, 0, 1, 1, 0, 2, 6, 0, 6, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		in := kerneltest.NewInput(data)
		flags := in.Next()
		cfg := Config{IPv6: flags&1 != 0, MasqueradeAll: flags&2 != 0, NodePortAddresses: in.NodePortAddresses(), Logger: zap.NewNop()}
		if flags&4 != 0 {
			cfg.ClusterCIDRs = []netip.Prefix{podCIDR, netip.MustParsePrefix("fd00:244::/64")}
		}
		fake := netfiltertest.NewFake()
		cfg.Exec, cfg.Conntrack = fake, &conntracktest.Table{}
		m, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		st := lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: nodeName}})
		for round := range 4 {
			services := in.Services(kerneltest.ServiceOptions{Node: nodeName, NodeIPs: []netip.Addr{nodeIP, nodeIP6}, Affinity: true, MaxEndpoints: 3, Endpoints: fuzzEndpoints})
			var snap *lb.Snapshot
			if round > 0 && in.Next()&1 != 0 {
				// Change some Services and keep the others, as sources do.
				snap, _ = st.Update(services, nil)
			} else {
				snap, _ = st.Replace(services) // conflicts and invalid Services are part of the game
			}
			full := round == 0 || in.Next()&3 == 0
			if err := m.Apply(context.Background(), snap, full); err != nil {
				t.Fatalf("round %d: Apply: %v", round, err)
			}
			var all []lb.Service
			for _, b := range snap.Balancers() {
				all = append(all, *b.Service)
			}
			for _, p := range fuzzPackets(all) {
				checkOutcomes(t, fake, p, expect(snap, m, p), fmt.Sprintf("round %d (full=%v)", round, full))
			}
			for _, fam := range m.families {
				for k, rules := range m.desiredChains(m.cur, fam) {
					if err := canonicalCheck(fam, rules); err != nil {
						t.Fatalf("%v %s: %v", fam, k.Chain, err)
					}
				}
			}
			// Incremental syncs leave what a full sync would.
			ref := netfiltertest.NewFake()
			rcfg := cfg
			rcfg.Exec = ref
			rm, err := New(rcfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := rm.Apply(context.Background(), snap, true); err != nil {
				t.Fatal(err)
			}
			if got, want := sortedLines(fake.Dump()), sortedLines(ref.Dump()); got != want {
				t.Fatalf("round %d (full=%v): the rules differ from a full sync of the same snapshot:\n%s\nfull sync:\n%s", round, full, fake.Dump(), ref.Dump())
			}
		}
		if err := m.Apply(context.Background(), st.Snapshot(), true); err != nil || m.Repairs() != 0 {
			t.Fatalf("final full sync: %v, %d repairs", err, m.Repairs())
		}
		if err := m.Cleanup(context.Background()); err != nil {
			t.Fatalf("Cleanup: %v", err)
		}
		if got, want := fake.Dump(), netfiltertest.NewFake().Dump(); got != want {
			t.Fatalf("Cleanup left:\n%s", got)
		}
	})
}
