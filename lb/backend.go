package lb

import (
	"net/netip"
	"sync/atomic"
	"time"
)

// HealthPolicy is passive health checking: a backend that refused a
// connection or timed out is skipped for a cool-down that doubles with every
// consecutive failure, from Base up to Max, and is forgotten on the first
// success. When every backend of a pool is cooling down they are all tried
// anyway: the health tracker alone never takes a Service dark.
type HealthPolicy struct {
	Base time.Duration // first cool-down; zero means 1s, negative disables passive health
	Max  time.Duration // longest cool-down; zero means 30s
}

func (h HealthPolicy) withDefaults() HealthPolicy {
	if h.Base == 0 {
		h.Base = time.Second
	}
	if h.Max == 0 {
		h.Max = 30 * time.Second
	}
	if h.Max < h.Base {
		h.Max = h.Base
	}
	return h
}

// Backend is the runtime state of one backend address (protocol, IP, port),
// shared by every Service that lists it and kept across snapshots while any
// Service does: its open connections and its passive health. All methods are
// safe for concurrent use and lock-free.
type Backend struct {
	Addr     netip.AddrPort
	Protocol Protocol
	Dial     string // Addr in the form net.Dial takes, computed once

	health HealthPolicy

	active    atomic.Int64  // open connections (or UDP flows)
	failures  atomic.Uint32 // consecutive failures
	coolUntil atomic.Int64  // unix nanoseconds; 0: healthy
}

func newBackend(proto Protocol, addr netip.AddrPort, h HealthPolicy) *Backend {
	return &Backend{Addr: addr, Protocol: proto, Dial: addr.String(), health: h}
}

// Acquire counts a new connection to b; pair it with Release.
func (b *Backend) Acquire() { b.active.Add(1) }

// Release ends a connection counted by Acquire.
func (b *Backend) Release() { b.active.Add(-1) }

// Active is the number of open connections to b.
func (b *Backend) Active() int64 { return b.active.Load() }

// ReportFailure records a refused or timed-out connection attempt at now,
// starting or lengthening b's cool-down.
func (b *Backend) ReportFailure(now time.Time) {
	if b.health.Base < 0 {
		return
	}
	n := b.failures.Add(1)
	d := b.health.Base
	for i := uint32(1); i < n && d < b.health.Max; i++ {
		d *= 2
	}
	d = min(d, b.health.Max)
	b.coolUntil.Store(now.Add(d).UnixNano())
}

// ReportSuccess records a successful connection: b is healthy again.
func (b *Backend) ReportSuccess() {
	// Load first: on the common path nothing is stored, so the cache line
	// is not bounced between cores on every connection.
	if b.failures.Load() != 0 {
		b.failures.Store(0)
		b.coolUntil.Store(0)
	}
}

// CoolingDown reports whether b is in a passive-health cool-down at now.
func (b *Backend) CoolingDown(now time.Time) bool {
	u := b.coolUntil.Load()
	return u != 0 && now.UnixNano() < u
}

// Failures is the number of consecutive failures b has had.
func (b *Backend) Failures() uint32 { return b.failures.Load() }

type backendKey struct {
	proto Protocol
	addr  netip.AddrPort
}
