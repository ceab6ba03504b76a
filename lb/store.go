package lb

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// StoreOptions configure a Store. The zero value is usable.
type StoreOptions struct {
	Node             Node             // this node, for Local traffic policies and topology
	DefaultAlgorithm Algorithm        // for Services that name none; zero means round robin
	Health           HealthPolicy     // passive health; zero means the defaults
	Now              func() time.Time // clock for snapshot times; nil means time.Now
}

// Store holds the Services every mode serves. Writers (sources) call
// Update or Replace; each call publishes one new immutable Snapshot, which
// readers get with Snapshot without locking.
type Store struct {
	opts StoreOptions

	mu        sync.Mutex
	balancers map[ServicePortName]*Balancer
	runtimes  map[ServicePortName]*serviceRuntime
	backends  map[backendKey]*backendRef
	version   uint64
	subs      []chan struct{}
	high      int // the most entries the maps above held since they were last compacted

	cur atomic.Pointer[Snapshot]
}

type backendRef struct {
	b    *Backend
	refs int
}

// NewStore returns a Store whose first Snapshot (version 0) is empty.
func NewStore(opts StoreOptions) *Store {
	if opts.DefaultAlgorithm == AlgorithmDefault {
		opts.DefaultAlgorithm = RoundRobin
	}
	opts.Health = opts.Health.withDefaults()
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Store{
		opts:      opts,
		balancers: map[ServicePortName]*Balancer{},
		runtimes:  map[ServicePortName]*serviceRuntime{},
		backends:  map[backendKey]*backendRef{},
	}
	s.cur.Store(&Snapshot{Time: opts.Now(), Node: opts.Node, balancers: map[ServicePortName]*Balancer{}})
	return s
}

// Snapshot returns the current snapshot. It never blocks.
func (s *Store) Snapshot() *Snapshot { return s.cur.Load() }

// Subscribe returns a channel that receives a value after each publish.
// It holds at most one pending value: a slow reader sees one wake-up for
// several publishes and reads the latest Snapshot.
func (s *Store) Subscribe() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{}, 1)
	s.subs = append(s.subs, ch)
	return ch
}

// Update adds or replaces the upserted Services and removes the deleted
// ones, then publishes one Snapshot. An invalid Service is skipped and its
// previous version, if any, stays: one bad Service never stops the others.
// The error joins every rejected Service and every frontend conflict.
func (s *Store) Update(upserts []Service, deletes []ServicePortName) (*Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, name := range deletes {
		s.remove(name)
	}
	for i := range upserts {
		if err := s.upsert(&upserts[i]); err != nil {
			errs = append(errs, err)
		}
	}
	snap, err := s.publish()
	return snap, errors.Join(append(errs, err)...)
}

// Replace makes the Store hold exactly services: those not named are
// removed. Invalid ones are reported and keep their previous version.
func (s *Store) Replace(services []Service) (*Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	named := make(map[ServicePortName]bool, len(services))
	for i := range services {
		named[services[i].Name] = true
	}
	for name := range s.balancers {
		if !named[name] {
			s.remove(name)
		}
	}
	var errs []error
	for i := range services {
		if err := s.upsert(&services[i]); err != nil {
			errs = append(errs, err)
		}
	}
	snap, err := s.publish()
	return snap, errors.Join(append(errs, err)...)
}

// Node returns the node the policy is evaluated for.
func (s *Store) Node() Node {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opts.Node
}

// SetNode changes the node the policy is evaluated for, as when the Node's
// topology.kubernetes.io/zone label changes: every Service's usable
// endpoints are decided again (backends keep their health and connection
// counts; a Service the change cannot affect keeps its Balancer) and one
// Snapshot is published. When n is already the node it
// publishes nothing and returns the current Snapshot. The error is
// Update's: frontend conflicts, which a new node does not change.
func (s *Store) SetNode(n Node) (*Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n == s.opts.Node {
		return s.cur.Load(), nil
	}
	zoneOnly := n.Name == s.opts.Node.Name
	s.opts.Node = n
	for _, bal := range s.balancers {
		if zoneOnly && !slices.ContainsFunc(bal.Service.Endpoints, func(ep Endpoint) bool { return len(ep.ZoneHints) > 0 }) {
			continue // the zone decides nothing here: keep the Balancer
		}
		// Already validated and owned by the Store: decide it again.
		s.balance(bal.Service)
	}
	return s.publish()
}

func (s *Store) upsert(in *Service) error {
	if err := in.Validate(); err != nil {
		return fmt.Errorf("service %v: %w", in.Name, err)
	}
	if old := s.balancers[in.Name]; old != nil && old.Service.equal(in) {
		// Written again as it is (a whole file re-read, a resync): the
		// Balancer stays, so Snapshot.Changed sees it unchanged at a
		// pointer's cost instead of comparing it in depth.
		return nil
	}
	s.balance(cloneService(in))
	return nil
}

// balance decides svc's pools for the Store's node and makes them its
// Balancer, replacing any previous one.
func (s *Store) balance(svc *Service) {
	rt := s.runtimes[svc.Name]
	if rt == nil {
		rt = &serviceRuntime{}
		s.runtimes[svc.Name] = rt
	}
	internal, external, short := UsableEndpoints(svc, s.opts.Node)
	bal := &Balancer{Service: svc}
	bal.Internal = s.newPool(svc, internal, false, rt, bal)
	asExternal := func(p *Pool) *Pool { // the same backends, for external traffic
		q := *p
		q.External = true
		return &q
	}
	if svc.InternalTrafficPolicy == svc.ExternalTrafficPolicy {
		bal.External = asExternal(bal.Internal)
	} else {
		bal.External = s.newPool(svc, external, true, rt, bal)
	}
	if svc.ExternalTrafficPolicy == PolicyLocal {
		if svc.InternalTrafficPolicy == PolicyCluster {
			bal.ShortCircuit = asExternal(bal.Internal)
		} else {
			bal.ShortCircuit = s.newPool(svc, short, true, rt, bal)
		}
		bal.External.short = bal.ShortCircuit
	}
	if old := s.balancers[svc.Name]; old != nil {
		s.unref(old)
	}
	s.balancers[svc.Name] = bal
}

func (s *Store) newPool(svc *Service, eps []Endpoint, external bool, rt *serviceRuntime, bal *Balancer) *Pool {
	p := &Pool{Service: svc, External: external, algo: svc.Algorithm, rt: rt}
	if p.algo == AlgorithmDefault {
		p.algo = s.opts.DefaultAlgorithm
	}
	p.backends = make([]*Backend, 0, len(eps))
	for _, ep := range eps {
		p.backends = append(p.backends, s.ref(svc.Protocol, ep.Addr, bal))
	}
	slices.SortFunc(p.backends, func(a, b *Backend) int { return a.Addr.Compare(b.Addr) })
	if p.algo == Maglev {
		p.maglev = maglevTable(p.backends)
	}
	return p
}

func (s *Store) ref(proto Protocol, addr netip.AddrPort, bal *Balancer) *Backend {
	k := backendKey{proto, addr}
	r := s.backends[k]
	if r == nil {
		r = &backendRef{b: newBackend(proto, addr, s.opts.Health)}
		s.backends[k] = r
	}
	if !slices.Contains(bal.refs, r.b) {
		bal.refs = append(bal.refs, r.b)
		r.refs++
	}
	return r.b
}

func (s *Store) unref(bal *Balancer) {
	for _, b := range bal.refs {
		k := backendKey{b.Protocol, b.Addr}
		if r := s.backends[k]; r != nil {
			if r.refs--; r.refs == 0 {
				delete(s.backends, k)
			}
		}
	}
}

func (s *Store) remove(name ServicePortName) {
	if bal := s.balancers[name]; bal != nil {
		s.unref(bal)
		delete(s.balancers, name)
		delete(s.runtimes, name)
	}
}

// compactMin is the least number of entries a Store's maps must once have
// held before they are compacted.
const compactMin = 1024

// compact rebuilds the Store's maps once they hold under a quarter of the
// entries they grew to. A Go map never gives back its buckets: after a
// configuration of 58,288 Services shrank to 3, they kept 14 MiB.
func (s *Store) compact() {
	n := len(s.balancers) + len(s.backends)
	s.high = max(s.high, n)
	if s.high < compactMin || 4*n >= s.high {
		return
	}
	s.balancers, s.runtimes, s.backends = resized(s.balancers), resized(s.runtimes), resized(s.backends)
	s.high = n
}

// resized copies m into a map sized for what it holds (maps.Clone keeps
// the source's size).
func resized[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// publish builds and swaps in a new Snapshot from s.balancers. Frontend
// conflicts go to the Service whose name sorts first; the others lose that
// frontend and are reported.
func (s *Store) publish() (*Snapshot, error) {
	s.compact()
	s.version++
	snap := &Snapshot{
		Version:   s.version,
		Time:      s.opts.Now(),
		Node:      s.opts.Node,
		balancers: make(map[ServicePortName]*Balancer, len(s.balancers)),
		frontends: make(map[Frontend]*Pool, len(s.balancers)),
		nodePorts: make(map[nodePortKey]*Pool),
		sorted:    make([]*Balancer, 0, len(s.balancers)),
	}
	for name, bal := range s.balancers {
		snap.balancers[name] = bal
		snap.sorted = append(snap.sorted, bal)
	}
	slices.SortFunc(snap.sorted, func(a, b *Balancer) int { return a.Service.Name.Compare(b.Service.Name) })
	var errs []error
	for _, bal := range snap.sorted {
		svc := bal.Service
		for f, external := range svc.frontends {
			if other, taken := snap.frontends[f]; taken {
				errs = append(errs, fmt.Errorf("service %v: frontend %v already belongs to %v", svc.Name, f, other.Service.Name))
				snap.lose(svc.Name)
				continue
			}
			snap.frontends[f] = bal.pool(external)
		}
		if svc.NodePort != 0 {
			k := nodePortKey{svc.Protocol, svc.NodePort}
			if other, taken := snap.nodePorts[k]; taken {
				errs = append(errs, fmt.Errorf("service %v: nodePort %v/%d already belongs to %v", svc.Name, svc.Protocol, svc.NodePort, other.Service.Name))
				snap.lose(svc.Name)
			} else {
				snap.nodePorts[k] = bal.External
			}
		}
	}
	s.cur.Store(snap)
	for _, ch := range s.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	return snap, errors.Join(errs...)
}

func cloneService(in *Service) *Service {
	svc := *in
	svc.ClusterIPs = unmapAll(in.ClusterIPs)
	svc.ExternalIPs = unmapAll(in.ExternalIPs)
	svc.LoadBalancerIPs = unmapAll(in.LoadBalancerIPs)
	svc.Endpoints = slices.Clone(in.Endpoints)
	for i := range svc.Endpoints {
		ep := &svc.Endpoints[i]
		ep.Addr = netip.AddrPortFrom(ep.Addr.Addr().Unmap(), ep.Addr.Port())
		ep.ZoneHints = slices.Clone(ep.ZoneHints)
		ep.NodeHints = slices.Clone(ep.NodeHints)
	}
	return &svc
}

// unmapAll copies ips with IPv4-mapped IPv6 addresses in their IPv4 form,
// the form connections are routed by.
func unmapAll(ips []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, len(ips))
	for i, ip := range ips {
		out[i] = ip.Unmap()
	}
	return out
}
