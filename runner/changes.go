package runner

import (
	"sync"
	"time"
)

// Changes follows Service and endpoint changes from a source receiving them
// to the sync that programs them, for kube-proxy's change counters, pending
// gauges and network programming latency. A source calls Received as each
// change arrives, Cut when it takes the changes received so far to write
// them into the Store, and Written with the Store version that write
// published; the sync loop calls Programmed with the version each successful
// sync served. A change counts as pending until then, and its trigger time,
// if any, is observed once, when it is programmed. The zero value is not
// usable; use NewChanges.
type Changes struct {
	m     *Metrics // nil: counted, not exported
	now   func() time.Time
	start time.Time // trigger times before this are not observed (kube-proxy's rule)

	mu         sync.Mutex
	arrived    batch      // received, not yet cut
	cut        batch      // cut, awaiting Written
	written    []versions // written at a version not yet programmed, oldest first
	programmed uint64     // the newest version a sync has served
	services   map[string]int
	endpoints  int
}

// batch is changes moving through the pipeline together.
type batch struct {
	endpoints int                 // endpoint changes
	services  map[string]struct{} // Services with a pending Service change
	triggered []time.Time         // trigger times to observe once programmed
}

type versions struct {
	version uint64
	batch
}

// NewChanges returns a Changes exporting to m (nil: none); now nil means
// time.Now.
func NewChanges(m *Metrics, now func() time.Time) *Changes {
	if now == nil {
		now = time.Now
	}
	return &Changes{m: m, now: now, start: now(), services: map[string]int{}}
}

// Received records one change: an EndpointSlice of service (endpoints) or
// the Service itself. triggered is when the change was triggered in the
// cluster (the EndpointSlice's endpoints.kubernetes.io/last-change-trigger-time,
// or a new Service's creation time); zero or earlier than the Changes was
// made means unknown, and nothing is observed for it.
func (c *Changes) Received(endpoints bool, service string, triggered time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := &c.arrived
	if endpoints {
		b.endpoints++
		c.endpoints++
		if c.m != nil {
			c.m.endpointsTotal.Inc()
		}
	} else {
		if b.services == nil {
			b.services = map[string]struct{}{}
		}
		if _, ok := b.services[service]; !ok {
			b.services[service] = struct{}{}
			c.services[service]++
		}
		if c.m != nil {
			c.m.servicesTotal.Inc()
		}
	}
	if !triggered.IsZero() && triggered.After(c.start) {
		b.triggered = append(b.triggered, triggered)
	}
	c.export()
}

// Cut takes every change received so far for the write the source is
// about to make. Call it together with taking the source's own dirty set,
// so a change lands in the write that carries it.
func (c *Changes) Cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.merge(&c.cut, c.arrived)
	c.arrived = batch{}
}

// Written says the changes last cut are in Store version (0: the write
// changed nothing the proxy serves, so they are done with and observe
// nothing, as kube-proxy observes only changes that needed a sync).
func (c *Changes) Written(version uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.cut
	c.cut = batch{}
	switch {
	case version == 0:
		b.triggered = nil
		c.done(b)
	case version <= c.programmed: // a sync served it before we were told
		c.done(b)
	default:
		c.written = append(c.written, versions{version, b})
	}
	c.export()
}

// Programmed says a sync has served Store version: every change written at
// or before it is done, and its trigger time observed.
func (c *Changes) Programmed(version uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.programmed = max(c.programmed, version)
	n := 0
	for _, w := range c.written {
		if w.version > c.programmed {
			break
		}
		c.done(w.batch)
		n++
	}
	c.written = c.written[n:]
	c.export()
}

// Pending returns the endpoint changes and the Services with changes that
// no sync has programmed yet.
func (c *Changes) Pending() (endpoints, services int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.endpoints, len(c.services)
}

// done retires b, observing its trigger times.
func (c *Changes) done(b batch) {
	c.endpoints -= b.endpoints
	for svc := range b.services {
		if c.services[svc]--; c.services[svc] <= 0 {
			delete(c.services, svc)
		}
	}
	if c.m == nil {
		return
	}
	now := c.now()
	for _, t := range b.triggered {
		for _, fam := range c.m.families {
			c.m.programming.WithLabelValues(fam).Observe(now.Sub(t).Seconds())
		}
	}
}

func (c *Changes) export() {
	if c.m != nil {
		c.m.endpointsPending.Set(float64(c.endpoints))
		c.m.servicesPending.Set(float64(len(c.services)))
	}
}

// merge adds b to a (a Cut without a Written in between), a Service in
// both counting once.
func (c *Changes) merge(a *batch, b batch) {
	a.endpoints += b.endpoints
	for svc := range b.services {
		if a.services == nil {
			a.services = map[string]struct{}{}
		}
		if _, dup := a.services[svc]; dup {
			c.services[svc]--
		}
		a.services[svc] = struct{}{}
	}
	a.triggered = append(a.triggered, b.triggered...)
}
