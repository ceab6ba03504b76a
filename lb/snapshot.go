package lb

import (
	"net/netip"
	"time"
)

// Balancer is one Service port as a Snapshot serves it: the Service and its
// pools for internal (ClusterIP) and external (NodePort, ExternalIP,
// LoadBalancer) traffic, already decided by UsableEndpoints.
type Balancer struct {
	Service  *Service
	Internal *Pool
	External *Pool

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

	balancers map[ServicePortName]*Balancer
	sorted    []*Balancer
	frontends map[Frontend]*Pool
	nodePorts map[nodePortKey]*Pool
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
