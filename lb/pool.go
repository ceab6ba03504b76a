package lb

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"
)

// Pool is the set of usable backends for one kind of traffic (internal or
// external) to one Service port, with the picker that chooses among them.
// A Pool belongs to one Snapshot and never changes; the runtime state it
// points to (cursor, affinity, connection counts) outlives it.
type Pool struct {
	Service  *Service
	External bool // NodePort / ExternalIP / LoadBalancer traffic

	backends []*Backend
	algo     Algorithm
	maglev   []uint16 // lookup table, when algo is Maglev
	rt       *serviceRuntime
	short    *Pool // see ShortCircuit
}

// serviceRuntime is a Service port's mutable state, kept across snapshots.
type serviceRuntime struct {
	cursor   atomic.Uint64 // round-robin position
	conns    atomic.Int64  // open connections, for per-service limits
	affinity affinityTable
}

// same reports whether p and o serve alike: the same kind of traffic, the
// same picker and the same backends in order.
func (p *Pool) same(o *Pool) bool {
	return p.External == o.External && p.algo == o.algo &&
		slices.EqualFunc(p.backends, o.backends, func(a, b *Backend) bool { return a == b || a.Protocol == b.Protocol && a.Addr == b.Addr })
}

// ShortCircuit returns the pool that serves a client inside the cluster (a
// pod, or this node) in place of p, or nil when there is none: the
// Balancer's ShortCircuit for its External pool, nil for every other.
// Routing a connection to an external frontend, a mode asks it only when
// it is not nil, so Services whose external policy is Cluster cost no
// check of the client.
func (p *Pool) ShortCircuit() *Pool { return p.short }

// Serves reports whether some client can be served through p: p has
// backends, or its short circuit has (a client inside the cluster is served
// where others are refused).
func (p *Pool) Serves() bool {
	return len(p.backends) > 0 || p.short != nil && len(p.short.backends) > 0
}

// Backends returns the usable backends; the caller must not modify the slice.
func (p *Pool) Backends() []*Backend { return p.backends }

// Algorithm is the picker this pool uses.
func (p *Pool) Algorithm() Algorithm { return p.algo }

// Conns is the open-connection counter shared by every pool of this Service
// port, for per-service connection limits.
func (p *Pool) Conns() *atomic.Int64 { return &p.rt.conns }

// MaxAttempts bounds how many backends one connection may try.
const MaxAttempts = 16

// Tried is the small set of backends a connection has already tried, so a
// retry goes to a different one. The zero value is empty; it lives on the
// caller's stack.
type Tried struct {
	n int
	b [MaxAttempts]*Backend
}

// Add records b as tried. Beyond MaxAttempts it is ignored.
func (t *Tried) Add(b *Backend) {
	if t.n < len(t.b) {
		t.b[t.n] = b
		t.n++
	}
}

// Has reports whether b was tried.
func (t *Tried) Has(b *Backend) bool {
	for _, x := range t.b[:t.n] {
		if x == b {
			return true
		}
	}
	return false
}

// Len is the number of backends tried.
func (t *Tried) Len() int { return t.n }

// Pick chooses a backend for a connection from client at now, skipping the
// ones in tried (nil: none). It returns nil when the pool is empty or every backend was
// tried. The first attempt honours ClientIP affinity; retries bypass it.
// Backends cooling down after failures are skipped unless nothing else is
// left. Pick never blocks and does not allocate (affinity aside).
func (p *Pool) Pick(client netip.Addr, tried *Tried, now time.Time) *Backend {
	if len(p.backends) == 0 {
		return nil
	}
	if tried == nil {
		tried = &Tried{}
	}
	affinity := p.Service.AffinityTimeout > 0
	if affinity && tried.Len() == 0 {
		if b := p.rt.affinity.get(client, now, p.Service.AffinityTimeout); b != nil && p.has(b) && !b.CoolingDown(now) {
			return b
		}
	}
	b := p.pick(client, tried, now, true)
	if b == nil {
		b = p.pick(client, tried, now, false)
	}
	if b != nil && affinity {
		p.rt.affinity.set(client, b, now, p.Service.AffinityTimeout)
	}
	return b
}

func (p *Pool) has(b *Backend) bool {
	for _, x := range p.backends {
		if x == b {
			return true
		}
	}
	return false
}

func (p *Pool) pick(client netip.Addr, tried *Tried, now time.Time, healthyOnly bool) *Backend {
	ok := func(b *Backend) bool {
		return !tried.Has(b) && !(healthyOnly && b.CoolingDown(now))
	}
	n := len(p.backends)
	switch p.algo {
	case Random:
		return p.scan(rand.IntN(n), ok)
	case LeastConn:
		if n == 1 {
			return p.scan(0, ok)
		}
		i := rand.IntN(n)
		j := rand.IntN(n - 1)
		if j >= i {
			j++
		}
		a, b := p.backends[i], p.backends[j]
		switch okA, okB := ok(a), ok(b); {
		case okA && okB:
			if b.Active() < a.Active() {
				return b
			}
			return a
		case okA:
			return a
		case okB:
			return b
		}
		return p.scan(i, ok)
	case Maglev:
		h := hashAddr(client)
		m := uint64(len(p.maglev))
		// Walk the table from the client's slot: an unusable backend's
		// clients spread over the others as the table's permutation does.
		for k := uint64(0); k < m && k < 64; k++ {
			if b := p.backends[p.maglev[(h+k)%m]]; ok(b) {
				return b
			}
		}
		return p.scan(int(h%uint64(n)), ok)
	default: // RoundRobin
		return p.scan(int(p.rt.cursor.Add(1)%uint64(n)), ok)
	}
}

// scan returns the first backend from start on (wrapping) that passes ok.
func (p *Pool) scan(start int, ok func(*Backend) bool) *Backend {
	n := len(p.backends)
	for k := 0; k < n; k++ {
		if b := p.backends[(start+k)%n]; ok(b) {
			return b
		}
	}
	return nil
}

// hashAddr is FNV-1a over the 16-byte form of a, so IPv4 and its mapped
// IPv6 form hash alike.
func hashAddr(a netip.Addr) uint64 {
	b := a.As16()
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}
