package redirect

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/conntrack/conntracktest"
	"github.com/svcproxy/svcproxy/internal/kerneltest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
	"github.com/svcproxy/svcproxy/redirect/steertable/steertabletest"
)

// fuzzPortsFor gives most UDP frontends and NodePorts a forwarder port.
func fuzzPortsFor(r *kerneltest.Input, services []lb.Service) Ports {
	p := Ports{TCP: testTCPPort, UDP: map[lb.Frontend]uint16{}}
	next := uint16(40000)
	add := func(a netip.AddrPort) {
		fe := lb.Frontend{Protocol: lb.UDP, Addr: a}
		if _, ok := p.UDP[fe]; ok || r.Pick(5) == 0 {
			return
		}
		next++
		p.UDP[fe] = next
	}
	for _, s := range services {
		if s.Protocol != lb.UDP {
			continue
		}
		for _, a := range slices.Concat(s.ClusterIPs, s.ExternalIPs, s.LoadBalancerIPs) {
			add(netip.AddrPortFrom(a, s.Port))
		}
		if s.NodePort != 0 {
			add(netip.AddrPortFrom(netip.IPv4Unspecified(), s.NodePort))
			add(netip.AddrPortFrom(netip.IPv6Unspecified(), s.NodePort))
		}
	}
	return p
}

// expect computes, straight from the snapshot, where p should go.
func expect(snap *lb.Snapshot, ports Ports, cfg Config, p netfiltertest.Packet) netfiltertest.Verdict {
	if p.Mark&cfg.Mark == cfg.Mark || p.Proto == lb.SCTP { // SCTP is never steered
		return accepted
	}
	dst := p.Dst
	fam := familyOf(dst.Addr())
	if fam == netfilter.IPv6 && !cfg.IPv6 {
		return accepted
	}
	src := p.Src.Addr()
	inside := src.IsLoopback() || slices.Contains(p.LocalAddrs, src) ||
		slices.ContainsFunc(cfg.ClusterCIDRs, func(c netip.Prefix) bool { return c.Contains(src) })
	steer := func(pool *lb.Pool, udpKey netip.AddrPort) (netfiltertest.Verdict, bool) {
		// Steered when the pool has endpoints, or its short circuit has
		// and the client is inside the cluster; else rejected.
		own := len(pool.Backends()) > 0
		short := pool.ShortCircuit() != nil && len(pool.ShortCircuit().Backends()) > 0
		if !own && !short {
			return rejected, true
		}
		to := ports.TCP
		if p.Proto == lb.UDP {
			if to = ports.UDP[lb.Frontend{Protocol: lb.UDP, Addr: udpKey}]; to == 0 {
				// Not programmed in this family; but the iptables
				// backend's NodePort sets serve both, and a short-circuit
				// NodePort the other family programmed is rejected here
				// too.
				other := netip.AddrPortFrom(netip.IPv6Unspecified(), udpKey.Port())
				if udpKey.Addr().Is6() {
					other = netip.AddrPortFrom(netip.IPv4Unspecified(), udpKey.Port())
				}
				if cfg.Backend == BackendIPTables && udpKey.Addr().IsUnspecified() && !own && (other.Addr().Is4() || cfg.IPv6) &&
					ports.UDP[lb.Frontend{Protocol: lb.UDP, Addr: other}] != 0 {
					return rejected, true
				}
				return netfiltertest.Verdict{}, false
			}
		}
		if !own && !inside {
			return rejected, true
		}
		return redirected(to), true
	}
	isVIP := false
	for _, b := range snap.Balancers() {
		s := b.Service
		if s.Protocol == p.Proto && s.Port == dst.Port() &&
			slices.Contains(slices.Concat(s.ClusterIPs, s.ExternalIPs, s.LoadBalancerIPs), dst.Addr()) {
			isVIP = true
		}
	}
	if isVIP {
		if v, ok := steer(snap.Route(p.Proto, dst), dst); ok {
			return v
		}
	}
	local := dst.Addr().IsLoopback() || slices.Contains(p.LocalAddrs, dst.Addr())
	allowed := true
	if len(cfg.NodePortAddresses) > 0 {
		allowed = false
		lifted := false
		for _, pfx := range cfg.NodePortAddresses {
			if familyOf(pfx.Addr()) == fam && pfx.Bits() == 0 {
				lifted = true
			}
			allowed = allowed || pfx.Contains(dst.Addr())
		}
		allowed = allowed || lifted
	}
	if local && allowed {
		hasNodePort := false
		for _, b := range snap.Balancers() {
			hasNodePort = hasNodePort || (b.Service.Protocol == p.Proto && b.Service.NodePort == dst.Port())
		}
		if hasNodePort {
			key := netip.AddrPortFrom(unspecified(fam), dst.Port())
			if v, ok := steer(snap.Route(p.Proto, key), key); ok {
				return v
			}
		}
	}
	if p.Proto == lb.UDP && local && socketPorts(snap, ports, fam)[dst.Port()] {
		return dropped // straight to a UDP frontend's socket, not steered
	}
	return accepted
}

// socketPorts are the forwarder ports of fam's steered UDP frontends.
func socketPorts(snap *lb.Snapshot, ports Ports, fam netfilter.Family) map[uint16]bool {
	out := map[uint16]bool{}
	add := func(pool *lb.Pool, key netip.AddrPort) {
		if familyOf(key.Addr()) != fam || pool == nil || snap.Route(lb.UDP, key) != pool {
			return
		}
		if to := ports.UDP[lb.Frontend{Protocol: lb.UDP, Addr: key}]; to != 0 {
			out[to] = true
		}
	}
	for _, b := range snap.Balancers() {
		s := b.Service
		if s.Protocol != lb.UDP {
			continue
		}
		for _, a := range s.ClusterIPs {
			add(b.Internal, netip.AddrPortFrom(a.Unmap(), s.Port))
		}
		for _, a := range slices.Concat(s.ExternalIPs, s.LoadBalancerIPs) {
			add(b.External, netip.AddrPortFrom(a.Unmap(), s.Port))
		}
		if s.NodePort != 0 && b.External != nil && snap.Route(lb.UDP, netip.AddrPortFrom(netip.IPv4Unspecified(), s.NodePort)) == b.External {
			if to := ports.UDP[lb.Frontend{Protocol: lb.UDP, Addr: netip.AddrPortFrom(unspecified(fam), s.NodePort)}]; to != 0 {
				out[to] = true
			}
		}
	}
	return out
}

// fuzzPackets are the packets worth tracing for services: to their
// frontends and NodePorts, and straight to the forwarder's UDP ports at
// the node's addresses and elsewhere.
func fuzzPackets(services []lb.Service, ports Ports) []netfiltertest.Packet {
	var out []netfiltertest.Packet
	dsts := kerneltest.Destinations(services, nodeIP, nodeIP2, nodeIP6)
	for _, to := range ports.UDP {
		for _, a := range []netip.Addr{nodeIP, nodeIP6, netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("203.0.113.99")} {
			dsts = append(dsts, netip.AddrPortFrom(a, to))
		}
	}
	for _, d := range dsts {
		for _, proto := range []lb.Protocol{lb.TCP, lb.UDP, lb.SCTP} {
			for _, hook := range []netfiltertest.Hook{netfiltertest.Prerouting, netfiltertest.Output} {
				if d.Addr().IsLoopback() && hook == netfiltertest.Prerouting {
					continue
				}
				for _, mark := range []uint32{0, testMark} {
					p := pkt(proto, d.String(), hook)
					p.Mark = mark
					out = append(out, p)
					if hook == netfiltertest.Prerouting && mark == 0 { // from outside the cluster too
						p.Src = outsideIP
						if d.Addr().Is6() {
							p.Src = outsideIP6
						}
						out = append(out, p)
					}
				}
			}
		}
	}
	return out
}

func FuzzApply(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{3, 1, 0, 1, 0, 1, 1, 2, 0, 3, 1, 1, 2, 7, 7, 0, 0, 1, 1, 0, 1, 1, 0, 2, 2, 1, 6, 2, 0, 1})
	f.Add([]byte{6, 0, 1, 1, 3, 1, 0, 2, 4, 5, 1, 4, 1, 5, 2, 6, 7, 1, 0, 1, 2, 3, 0, 1, 1, 2, 1, 0, 0, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17})
	f.Add([]byte{5, 2, 1, 1, 1, 1, 0, 1, 4, 1, 1, 0, 1, 7, 3, 1, 1, 1, 1, 1, 0, 1, 0, 2, 6, 4, 1, 1, 1, 1, 1, 1, 2, 7, 7, 2, 1, 0, 3, 1, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		in := kerneltest.NewInput(data)
		flags := in.Next()
		cfg := Config{Mark: testMark, IPv6: flags&1 != 0, NodePortAddresses: in.NodePortAddresses(), Logger: zap.NewNop(),
			Backend: BackendIPTables, Exec: netfiltertest.NewFake(), NFT: steertabletest.NewFake(), Conntrack: &conntracktest.Table{}}
		switch flags >> 2 & 3 { // the clients' prefixes: around the test's pod client, elsewhere, or none
		case 1:
			cfg.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/48")}
		case 2:
			cfg.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}
		}
		var fake interface {
			tracer
			empty() bool
		} = iptablesFake{cfg.Exec.(*netfiltertest.Fake)}
		if flags&2 != 0 {
			cfg.Backend = BackendNFTables
			fake = nftFake{cfg.NFT.(*steertabletest.Fake)}
		}
		r, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		st := lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: nodeName}})
		for round := range 3 {
			services := in.Services(kerneltest.ServiceOptions{Node: nodeName, NodeIPs: []netip.Addr{nodeIP, nodeIP6}, MaxEndpoints: 2})
			snap, _ := st.Replace(services) // conflicts and invalid Services are part of the game
			ports := fuzzPortsFor(in, services)
			full := round == 0 || in.Next()&1 != 0
			_ = r.Apply(context.Background(), snap, ports, full) // missing UDP ports are reported
			for _, p := range fuzzPackets(services, ports) {
				want := expect(snap, ports, cfg, p)
				got := fake.Trace(p)
				if got.Action != want.Action || got.Port != want.Port {
					t.Fatalf("round %d (full=%v): %v %v via %s mark %#x: got %v (rule %q), want %v\nservices: %+v\nports: %v\n%s",
						round, full, p.Proto, p.Dst, hookName(p.Hook), p.Mark, got, got.Rule, want, services, ports.UDP, fake.Dump())
				}
			}
		}
		if err := r.Cleanup(context.Background()); err != nil {
			t.Fatalf("Cleanup: %v", err)
		}
		if !fake.empty() {
			t.Fatalf("Cleanup left:\n%s", fake.Dump())
		}
	})
}

type iptablesFake struct{ *netfiltertest.Fake }

func (f iptablesFake) empty() bool { return f.Dump() == netfiltertest.NewFake().Dump() }

type nftFake struct{ *steertabletest.Fake }

func (f nftFake) empty() bool { return !f.Has(netfilter.IPv4) && !f.Has(netfilter.IPv6) }
