package lb

import (
	"iter"
	"net/netip"
	"slices"
	"time"
)

// Balancer is one Service port as a Snapshot serves it: the Service and its
// pools for internal (ClusterIP) and external (NodePort, ExternalIP,
// LoadBalancer) traffic, already decided by UsableEndpoints.
type Balancer struct {
	Service  *Service
	Internal *Pool
	External *Pool
	// ShortCircuit, when the external policy is Local, serves the
	// clients of the external frontends that are inside the cluster —
	// pods (the cluster CIDRs) and the node itself (its own addresses) —
	// with the Cluster policy's endpoints, as kube-proxy does (see
	// UsableEndpoints); External.ShortCircuit() is this pool. Nil with an
	// external policy of Cluster. Each mode decides who is inside: the
	// kernel modes by rules on the source address, the forwarder by
	// asking Config.Inside.
	ShortCircuit *Pool

	refs []*Backend // every backend the pools use, once
}

func (b *Balancer) pool(external bool) *Pool {
	if external {
		return b.External
	}
	return b.Internal
}

type nodePortKey struct {
	proto Protocol
	port  uint16
}

// Snapshot is an immutable, versioned view of every Service port. Modes
// translate it; the forwarder routes connections with it. Share it freely.
type Snapshot struct {
	Version uint64
	Time    time.Time // when it was published
	Node    Node      // the node the pools were decided for

	balancers map[ServicePortName]*Balancer
	sorted    []*Balancer
	frontends map[Frontend]*Pool
	nodePorts map[nodePortKey]*Pool
	lost      map[ServicePortName]struct{} // ports that lost a frontend or NodePort in a conflict; nil: none
}

func (s *Snapshot) lose(name ServicePortName) {
	if s.lost == nil {
		s.lost = map[ServicePortName]struct{}{}
	}
	s.lost[name] = struct{}{}
}

// Route returns the pool serving a connection addressed to dst: the Service
// whose ClusterIP, ExternalIP or LoadBalancer IP and port is dst, else the
// Service with dst's port as its NodePort (the caller has established dst is
// one of the node's addresses). Nil means no Service: refuse the connection.
func (s *Snapshot) Route(proto Protocol, dst netip.AddrPort) *Pool {
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	if p := s.frontends[Frontend{proto, dst}]; p != nil {
		return p
	}
	return s.nodePorts[nodePortKey{proto, dst.Port()}]
}

// ShortCircuits counts the externally reachable Service ports whose
// External pool and short circuit (Balancer.ShortCircuit) both have
// backends, and different ones, and names the first: where a mode that
// serves every client of a frontend alike (IPVS) must choose one for all.
func (s *Snapshot) ShortCircuits() (n int, first ServicePortName) {
	for _, b := range s.sorted {
		svc := b.Service
		external := svc.NodePort != 0 || len(svc.ExternalIPs)+len(svc.LoadBalancerIPs) > 0
		if external && b.ShortCircuit != nil && len(b.External.backends) > 0 && len(b.ShortCircuit.backends) > 0 &&
			!b.ShortCircuit.same(b.External) {
			if n == 0 {
				first = b.Service.Name
			}
			n++
		}
	}
	return n, first
}

// Balancers returns every Service port, sorted by name. Do not modify.
func (s *Snapshot) Balancers() []*Balancer { return s.sorted }

// Balancer returns the named Service port, or nil.
func (s *Snapshot) Balancer(name ServicePortName) *Balancer { return s.balancers[name] }

// Len is the number of Service ports.
func (s *Snapshot) Len() int { return len(s.sorted) }

// HasEndpoint reports whether the Service port still lists addr among its
// endpoints, in any condition. A connection whose backend is no longer
// listed drains.
func (s *Snapshot) HasEndpoint(name ServicePortName, addr netip.AddrPort) bool {
	b := s.balancers[name]
	if b == nil {
		return false
	}
	for i := range b.Service.Endpoints {
		if b.Service.Endpoints[i].Addr == addr {
			return true
		}
	}
	return false
}

// Frontends yields the fixed frontends of b, one of s's Balancers, that s
// routes to it, each with the pool serving it: its ClusterIPs (Internal),
// then its ExternalIPs and LoadBalancer IPs (External), at its port. A
// frontend another Service won in a conflict is left out; so is the
// NodePort, which is on every node address (see NodePort).
func (s *Snapshot) Frontends(b *Balancer) iter.Seq2[Frontend, *Pool] {
	return func(yield func(Frontend, *Pool) bool) {
		_, lost := s.lost[b.Service.Name]
		for f, external := range b.Service.frontends {
			p := b.pool(external)
			if lost && s.frontends[f] != p {
				continue
			}
			if !yield(f, p) {
				return
			}
		}
	}
}

// NodePort returns the NodePort of b, one of s's Balancers, if s routes it
// to b's External pool; 0 when it has none or another Service won it.
func (s *Snapshot) NodePort(b *Balancer) uint16 {
	np := b.Service.NodePort
	if np == 0 {
		return 0
	}
	if _, lost := s.lost[b.Service.Name]; lost && s.nodePorts[nodePortKey{b.Service.Protocol, np}] != b.External {
		return 0
	}
	return np
}

// Diff is what changed between two Snapshots, by Service port, each list
// sorted by name.
type Diff struct {
	Added, Updated, Removed []ServicePortName
}

// Empty reports whether nothing changed.
func (d Diff) Empty() bool { return len(d.Added)+len(d.Updated)+len(d.Removed) == 0 }

// Changed returns the Service ports added, updated and removed since prev
// (nil: every port is added). A port is updated when its Service, its
// pools' backends or picker, or the frontends and NodePort it owns changed;
// a port written again with the same content, or decided again with the
// same result, is not. It walks both snapshots' sorted ports once and
// compares in depth only the ports whose Balancer was replaced or that lost
// a conflict in either: cheap for 10,000 Services.
func (s *Snapshot) Changed(prev *Snapshot) Diff {
	var d Diff
	var old []*Balancer
	if prev != nil {
		old = prev.sorted
	}
	cur := s.sorted
	for len(old) > 0 || len(cur) > 0 {
		var c int // which comes first: the old port (removed), the new (added) or both
		switch {
		case len(old) == 0:
			c = 1
		case len(cur) == 0:
			c = -1
		default:
			c = old[0].Service.Name.Compare(cur[0].Service.Name)
		}
		switch {
		case c < 0:
			d.Removed = append(d.Removed, old[0].Service.Name)
			old = old[1:]
		case c > 0:
			d.Added = append(d.Added, cur[0].Service.Name)
			cur = cur[1:]
		default:
			if !s.same(cur[0], prev, old[0]) {
				d.Updated = append(d.Updated, cur[0].Service.Name)
			}
			old, cur = old[1:], cur[1:]
		}
	}
	return d
}

// same reports whether b in s serves as a in prev: the same Service, pools
// and owned frontends (which, for the same Service, only a conflict with
// another can change).
func (s *Snapshot) same(b *Balancer, prev *Snapshot, a *Balancer) bool {
	if a != b && (!a.Service.equal(b.Service) || !a.Internal.same(b.Internal) || !a.External.same(b.External) ||
		(a.ShortCircuit == nil) != (b.ShortCircuit == nil) || a.ShortCircuit != nil && !a.ShortCircuit.same(b.ShortCircuit)) {
		return false
	}
	_, lostNow := s.lost[b.Service.Name]
	_, lostThen := prev.lost[a.Service.Name]
	if !lostNow && !lostThen {
		return true
	}
	owned := func(snap *Snapshot, bal *Balancer) (out []Frontend) {
		for f := range snap.Frontends(bal) {
			out = append(out, f)
		}
		return out
	}
	return prev.NodePort(a) == s.NodePort(b) && slices.Equal(owned(prev, a), owned(s, b))
}
