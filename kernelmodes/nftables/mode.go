package nftables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/nftable"
)

// DefaultMark is the masquerade mark when Config.Mark is zero: kube-proxy's.
const DefaultMark = 0x4000

// defaultAvoidMark is the forwarder's default SO_MARK, which the masquerade
// mark must not overlap.
const defaultAvoidMark = 0x80000

// Table is the name of the mode's table in each family (ip and ip6).
const Table = "svcproxy"

// Config configures the nftables mode. The zero value is usable: mark
// 0x4000, NodePorts on every node address but loopback, no masquerade of
// ClusterIP traffic, IPv4 only, netlink in this network namespace.
type Config struct {
	// Mark is the packet mark bit(s) that ask the postrouting chain to
	// masquerade. Zero means DefaultMark.
	Mark uint32
	// AvoidMark are mark bits other parts of svcproxy use; Mark must not
	// overlap them. Zero means 0x80000, the forwarder's default.
	AvoidMark uint32
	// NodePortAddresses restricts NodePorts to the node's addresses inside
	// these prefixes, as in the iptables mode. Empty: every local address.
	// A /0 of a family lifts the restriction for that family; a family
	// with no prefix gets no NodePorts. Loopback never serves NodePorts.
	NodePortAddresses []netip.Prefix
	// ClusterCIDRs are the pod ranges, at most one per family: ClusterIP
	// traffic from outside them is masqueraded.
	ClusterCIDRs []netip.Prefix
	// MasqueradeAll masquerades all traffic sent to ClusterIPs, from pods
	// too (kube-proxy's --masquerade-all); external traffic is masqueraded
	// as without it.
	MasqueradeAll bool
	// IPv6 also programs the ip6 table.
	IPv6 bool
	// FullSyncPeriod is how often a full Apply really is one (every
	// element read back and repaired). A full Apply sooner only checks that
	// the tables, sets and chains are there. Zero: one hour. Negative:
	// every full Apply.
	FullSyncPeriod time.Duration
	// NetNS is the named network namespace (ip netns) to program; empty:
	// this process's.
	NetNS string
	// Kernel reads and writes the tables. Nil: netlink in NetNS.
	Kernel Kernel
	// Conntrack clears the entries of packets that reached a frontend
	// before it was served (conntrack.ClearUnNATed), and of UDP flows DNATed
	// to an endpoint that left (conntrack.DeleteMatching). Nil:
	// conntrack.NewNetlink(NetNS).
	Conntrack conntrack.Table
	// Logger; nil: no logging.
	Logger *zap.Logger
}

// Layout is what a family's table looks like beyond its elements: the
// fixed chains' rules depend on it (see the package doc).
type Layout struct {
	Family netfilter.Family
	// Mark is the masquerade mark.
	Mark uint32
	// ClusterCIDR, if valid, is the pod range: SetMasqueradeOffCluster
	// applies to sources outside it.
	ClusterCIDR netip.Prefix
	// NodePorts says whether the family serves NodePorts at all;
	// NodePortPrefixes, if not empty, restricts them to local addresses
	// inside these prefixes.
	NodePorts        bool
	NodePortPrefixes []netip.Prefix
	// AffinityTimeouts are the distinct session affinity timeouts of the
	// Services, in seconds, sorted: each has its pair of sets and its rule
	// recording a client's endpoint (the timeout is part of the rule).
	AffinityTimeouts []uint32
}

// ElementSets are the sets of l's table whose elements the mode writes:
// Sets, then each affinity timeout's pair.
func (l Layout) ElementSets() []string {
	out := slices.Clone(Sets)
	for _, secs := range l.AffinityTimeouts {
		out = append(out, AffinitySet(secs), AffinityNodePortSet(secs))
	}
	return out
}

// Kernel is what the mode needs of nf_tables, one family's table at a time.
type Kernel interface {
	// Setup makes l's table, sets and chains exist and writes the chains'
	// rules, in one transaction, leaving elements alone. It reports whether
	// everything was already there as l says (sets, chains, each chain's
	// number of rules); an intact table is left alone unless rewrite is
	// set.
	Setup(ctx context.Context, l Layout, rewrite bool) (intact bool, err error)
	// Elements reads a set's elements back.
	Elements(ctx context.Context, fam netfilter.Family, set string) (Elements, error)
	// Update deletes, then adds, elements of fam's table, in as few
	// transactions as fit (one for a change of a few Services).
	Update(ctx context.Context, fam netfilter.Family, del, add []Element) error
	// Delete removes fam's table; a table that is not there is no error.
	Delete(ctx context.Context, fam netfilter.Family) error
	// Probe reports why the mode cannot run for fam, or nil.
	Probe(ctx context.Context, fam netfilter.Family) error
}

// NetlinkKernel is the Kernel over nf_tables netlink in the named network
// namespace ns ("": this process's); on other systems every call fails.
func NetlinkKernel(ns string) Kernel { return newNetlinkKernel(ns) }

// Element is one element of a set: Val is empty unless the set is a map.
type Element = nftable.Element

// Mode is the nftables mode. Its methods are safe for concurrent use;
// calls are serialised.
type Mode struct {
	cfg      Config
	k        Kernel
	log      *zap.Logger
	families []netfilter.Family
	layouts  [2]Layout

	clusterCIDR [2]netip.Prefix
	nodePorts   [2]bool

	relayout bool // this Apply changes the layout: a table not as it was is no repair

	repairs  atomic.Uint64
	failures [2]atomic.Uint64

	mu       sync.Mutex
	cur      *state
	lastFull time.Time
	now      func() time.Time
	served   conntrack.Served
	ct       *conntrack.Counting // cfg.Conntrack, counted
}

// New checks cfg and returns the mode; it touches no kernel state.
func New(cfg Config) (*Mode, error) {
	if cfg.Mark == 0 {
		cfg.Mark = DefaultMark
	}
	if cfg.AvoidMark == 0 {
		cfg.AvoidMark = defaultAvoidMark
	}
	if cfg.Mark&cfg.AvoidMark != 0 {
		return nil, fmt.Errorf("creating nftables mode: masquerade mark %#x overlaps mark %#x (the forwarder's)", cfg.Mark, cfg.AvoidMark)
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	switch {
	case cfg.FullSyncPeriod == 0:
		cfg.FullSyncPeriod = time.Hour
	case cfg.FullSyncPeriod < 0:
		cfg.FullSyncPeriod = 0
	}
	m := &Mode{cfg: cfg, k: cfg.Kernel, log: cfg.Logger.Named("nftables"), families: []netfilter.Family{netfilter.IPv4}, now: time.Now}
	if m.k == nil {
		m.k = NetlinkKernel(cfg.NetNS)
	}
	if cfg.Conntrack == nil {
		m.cfg.Conntrack = conntrack.NewNetlink(cfg.NetNS)
	}
	m.ct = &conntrack.Counting{Table: m.cfg.Conntrack}
	if cfg.IPv6 {
		m.families = append(m.families, netfilter.IPv6)
	}
	restricted, addrs, err := netfilter.NodePortPrefixes(cfg.NodePortAddresses)
	if err != nil {
		return nil, fmt.Errorf("creating nftables mode: %w", err)
	}
	if m.clusterCIDR, err = netfilter.ClusterCIDRs(cfg.ClusterCIDRs); err != nil {
		return nil, fmt.Errorf("creating nftables mode: %w", err)
	}
	for _, fam := range m.families {
		m.nodePorts[fam] = !restricted[fam] || len(addrs[fam]) > 0
		l := Layout{Family: fam, Mark: cfg.Mark, ClusterCIDR: m.clusterCIDR[fam], NodePorts: m.nodePorts[fam]}
		if restricted[fam] {
			l.NodePortPrefixes = slices.Clone(addrs[fam])
		}
		m.layouts[fam] = l
	}
	return m, nil
}

// Repairs counts full syncs that found a table changed behind svcproxy's
// back and repaired it.
func (m *Mode) Repairs() uint64 { return m.repairs.Load() }

// RestoreFailures counts failed transactions on family's table (the
// iptables modes count failed iptables-restores under the same metric).
func (m *Mode) RestoreFailures(family netfilter.Family) uint64 { return m.failures[family].Load() }

// Apply makes the kernel serve snap. An incremental Apply writes only the
// elements of the Service ports that changed since the last, in one
// transaction per family; a full one also makes sure the tables, sets and
// chains are there, and, once per FullSyncPeriod (or when they were not),
// reads every element back and repairs what differs.
func (m *Mode) Apply(ctx context.Context, snap *lb.Snapshot, full bool) error {
	if snap == nil {
		return errors.New("applying nftables rules: nil snapshot")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	start := time.Now()
	prev := m.cur
	kind := "incremental"
	var err error
	var changed int
	var flows [2][]conntrack.Match
	if timeouts := affinityTimeouts(snap); !slices.Equal(timeouts, m.layouts[m.families[0]].AffinityTimeouts) {
		// A new affinity timeout, or the last of one gone: the rules
		// change, so this Apply rewrites the table.
		for _, fam := range m.families {
			m.layouts[fam].AffinityTimeouts = timeouts
		}
		if prev != nil {
			full, m.relayout = true, true
			m.lastFull = time.Time{}
			defer func() { m.relayout = false }()
		}
	}
	if prev == nil || full {
		deep := prev == nil || m.cfg.FullSyncPeriod == 0 || m.now().Sub(m.lastFull) >= m.cfg.FullSyncPeriod
		kind = "checked"
		if deep {
			kind = "full"
		}
		var next *state
		next, flows, err = m.fullSync(ctx, snap, prev, deep)
		if err == nil {
			m.cur = next
			changed = next.snap.Len()
			if deep {
				m.lastFull = m.now()
			}
		}
	} else {
		changed, flows, err = m.incremental(ctx, snap, prev)
		if err != nil {
			m.log.Warn("incremental sync failed; doing a full one", zap.Error(err))
			kind = "full"
			var next *state
			if next, flows, err = m.fullSync(ctx, snap, nil, true); err == nil {
				m.cur = next
				m.lastFull = m.now()
			}
		}
	}
	if err != nil {
		m.cur = nil
	} else {
		m.clearStaleFlows(ctx, flows)
		m.served.Clear(ctx, m.ct, snap, func(bal *lb.Balancer) []lb.Frontend { return conntrack.WithEndpoints(snap, bal, m.cfg.IPv6) }, m.log)
	}
	took := time.Since(start)
	level := zap.DebugLevel
	if kind == "full" && (prev == nil || took > time.Second) {
		level = zap.InfoLevel
	}
	m.log.Log(level, "synced", zap.String("sync", kind), zap.Uint64("version", snap.Version),
		zap.Int("services", snap.Len()), zap.Int("changed", changed), zap.Duration("duration", took), zap.Error(err))
	if err != nil {
		return fmt.Errorf("applying nftables rules: %w", err)
	}
	return nil
}

// build computes every Service port's elements for snap, then their union
// in maps sized for it (growing maps of 680,000 elements cost as much as
// filling them).
func (m *Mode) build(snap *lb.Snapshot) *state {
	s := newState(snap)
	var count [2]map[string]int
	for _, bal := range snap.Balancers() {
		if bal == nil || bal.Service == nil {
			continue
		}
		se := m.service(snap, bal)
		s.svcs[bal.Service.Name] = se
		for _, fam := range m.families {
			if count[fam] == nil {
				count[fam] = map[string]int{}
			}
			for _, e := range se.elems[fam] {
				count[fam][e.set]++
			}
		}
	}
	for _, fam := range m.families {
		for set, n := range count[fam] {
			s.tables[fam][set] = make(Elements, n)
		}
	}
	var d delta
	for _, se := range s.svcs {
		for _, fam := range m.families {
			for _, e := range se.elems[fam] {
				s.put(fam, e, &d)
			}
		}
		d = delta{d.del[:0], d.add[:0]}
	}
	return s
}

func (m *Mode) service(snap *lb.Snapshot, bal *lb.Balancer) *svcElems {
	se := &svcElems{}
	for _, fam := range m.families {
		m.compute(snap, bal, fam, se)
	}
	return se
}

// fullSync writes snap as a whole. deep reads every element back and
// writes the difference (a repair if prev, what the mode last wrote, says
// otherwise); shallow only makes sure the tables, sets and chains are
// there, and goes deep when they were not. The UDP flows returned are
// those of prev that snap no longer has.
func (m *Mode) fullSync(ctx context.Context, snap *lb.Snapshot, prev *state, deep bool) (*state, [2][]conntrack.Match, error) {
	var stale [2][]conntrack.Match
	if !deep && prev != nil {
		for _, fam := range m.families {
			intact, err := m.k.Setup(ctx, m.layouts[fam], false)
			if err != nil {
				m.failures[fam].Add(1)
				return nil, stale, fmt.Errorf("setting up the %v table: %w", fam, err)
			}
			if !intact {
				m.log.Warn("the table was changed behind svcproxy's back; repairing", zap.Stringer("family", fam))
				return m.fullSync(ctx, snap, prev, true)
			}
		}
		_, flows, err := m.incremental(ctx, snap, prev)
		return prev, flows, err
	}
	next := m.build(snap)
	repaired := false
	for _, fam := range m.families {
		intact, err := m.k.Setup(ctx, m.layouts[fam], true)
		if err != nil {
			m.failures[fam].Add(1)
			return nil, stale, fmt.Errorf("setting up the %v table: %w", fam, err)
		}
		var del, add []Element
		var diffs []string
		for _, set := range m.layouts[fam].ElementSets() {
			have, err := m.k.Elements(ctx, fam, set)
			if err != nil {
				return nil, stale, fmt.Errorf("reading the %v set %s: %w", fam, set, err)
			}
			want := next.tables[fam][set]
			var wrote Elements
			if prev != nil {
				wrote = prev.tables[fam][set]
			}
			for k, v := range have {
				if w, ok := want[k]; !ok || w != v {
					del = append(del, Element{Set: set, Key: k, Val: v})
				}
				if prev != nil {
					if w, ok := wrote[k]; !ok || w != v {
						diffs = append(diffs, set+": an element svcproxy did not write")
					}
				}
			}
			for k, v := range want {
				if h, ok := have[k]; !ok || h != v {
					add = append(add, Element{Set: set, Key: k, Val: v})
				}
			}
			if prev != nil {
				for k := range wrote {
					if _, ok := have[k]; !ok {
						diffs = append(diffs, set+": an element svcproxy wrote is missing")
					}
				}
			}
		}
		if prev != nil && ((!intact && !m.relayout) || len(diffs) > 0) {
			repaired = true
			if !intact {
				diffs = append(diffs, "table, sets or chains missing or changed")
			}
			m.log.Warn("the table was changed behind svcproxy's back; repairing", zap.Stringer("family", fam),
				zap.Int("differences", len(diffs)), zap.Strings("first", diffs[:min(len(diffs), 5)]))
		}
		if err := m.k.Update(ctx, fam, del, add); err != nil {
			m.failures[fam].Add(1)
			return nil, stale, fmt.Errorf("writing the %v table's elements: %w", fam, err)
		}
	}
	if repaired {
		m.repairs.Add(1)
		m.served.Reset() // meanwhile packets met no rule: every frontend's entries are suspect
	}
	if prev != nil {
		for _, fam := range m.families {
			stale[fam] = staleFlows(prev, next, fam)
			m.clearAffinity(ctx, fam, prev.svcs, next.svcs, nil)
		}
	}
	return next, stale, nil
}

// incremental writes the elements of the Service ports snap changed since
// prev, updating prev into the new state. On error the state is unusable
// (the caller does a full sync).
func (m *Mode) incremental(ctx context.Context, snap *lb.Snapshot, prev *state) (int, [2][]conntrack.Match, error) {
	var stale [2][]conntrack.Match
	diff := snap.Changed(prev.snap)
	names := slices.Concat(diff.Removed, diff.Updated, diff.Added)
	if len(names) == 0 {
		prev.snap = snap
		return 0, stale, nil
	}
	var deltas [2]delta
	changedSvcs := map[lb.ServicePortName][2]*svcElems{}
	for _, name := range names {
		old := prev.svcs[name]
		var next *svcElems
		if bal := snap.Balancer(name); bal != nil && bal.Service != nil {
			next = m.service(snap, bal)
		}
		changedSvcs[name] = [2]*svcElems{old, next}
		for _, fam := range m.families {
			if old != nil {
				for _, e := range old.elems[fam] {
					prev.drop(fam, e, &deltas[fam])
				}
			}
		}
	}
	for _, name := range names {
		next := changedSvcs[name][1]
		if next == nil {
			delete(prev.svcs, name)
			continue
		}
		prev.svcs[name] = next
		for _, fam := range m.families {
			for _, e := range next.elems[fam] {
				prev.put(fam, e, &deltas[fam])
			}
		}
	}
	prev.snap = snap
	for _, fam := range m.families {
		d := &deltas[fam]
		d.cancel()
		if !d.empty() {
			if err := m.k.Update(ctx, fam, toElements(d.del), toElements(d.add)); err != nil {
				m.failures[fam].Add(1)
				return 0, stale, fmt.Errorf("writing the %v table's elements: %w", fam, err)
			}
		}
		m.clearAffinity(ctx, fam, nil, nil, changedSvcs)
		for _, c := range changedSvcs {
			var now []conntrack.Match
			if c[1] != nil {
				now = c[1].flows[fam]
			}
			if c[0] != nil {
				for _, f := range c[0].flows[fam] {
					if !slices.Contains(now, f) {
						stale[fam] = append(stale[fam], f)
					}
				}
			}
		}
	}
	return len(names), stale, nil
}

func toElements(es []elem) []Element {
	out := make([]Element, len(es))
	for i, e := range es {
		out[i] = Element{Set: e.set, Key: e.key, Val: e.val}
	}
	return out
}

// staleFlows are the UDP flows of prev's Service ports that next has not.
func staleFlows(prev, next *state, fam netfilter.Family) []conntrack.Match {
	var out []conntrack.Match
	for name, old := range prev.svcs {
		var now []conntrack.Match
		if n := next.svcs[name]; n != nil {
			now = n.flows[fam]
		}
		for _, f := range old.flows[fam] {
			if !slices.Contains(now, f) {
				out = append(out, f)
			}
		}
	}
	return out
}

// affinityTimeouts are the distinct affinity timeouts of snap's Service
// ports, in seconds, sorted.
func affinityTimeouts(snap *lb.Snapshot) []uint32 {
	var out []uint32
	for _, bal := range snap.Balancers() {
		if bal == nil || bal.Service == nil {
			continue
		}
		if secs := affinitySeconds(bal.Service); secs > 0 && !slices.Contains(out, secs) {
			out = append(out, secs)
		}
	}
	slices.Sort(out)
	return out
}

// clearAffinity deletes the affinity elements that remember a client with
// an endpoint its frontend no longer has (or a frontend that no longer has
// affinity): their next connection picks afresh. The Service ports
// compared are those of changed (old, new), or every one of prev and next.
func (m *Mode) clearAffinity(ctx context.Context, fam netfilter.Family, prev, next map[lb.ServicePortName]*svcElems, changed map[lb.ServicePortName][2]*svcElems) {
	gone := map[string][]string{} // frontend key → the endpoint values still allowed
	note := func(old, cur *svcElems) {
		if old == nil || old.sticky[fam] == nil {
			return
		}
		for fk, was := range old.sticky[fam] {
			var now []string
			if cur != nil {
				now = cur.sticky[fam][fk]
			}
			for _, v := range was {
				if !slices.Contains(now, v) {
					gone[fk] = now
					break
				}
			}
		}
	}
	for _, c := range changed {
		note(c[0], c[1])
	}
	for name, old := range prev {
		note(old, next[name])
	}
	if len(gone) == 0 {
		return
	}
	els, err := m.k.Elements(ctx, fam, SetAffinity)
	if err != nil {
		m.log.Warn("reading the affinity map to clear clients of removed endpoints", zap.Error(err))
		return
	}
	n := nftable.AddrLen(fam)
	var del []Element
	for k, v := range els {
		allowed, ok := gone[k[n:]] // a frontend
		if !ok && len(k) >= 2*n {
			allowed, ok = gone[k[2*n:]] // a NodePort: protocol . port
		}
		if ok && !slices.Contains(allowed, v) {
			del = append(del, Element{Set: SetAffinity, Key: k, Val: v})
		}
	}
	if len(del) == 0 {
		return
	}
	if err := m.k.Update(ctx, fam, del, nil); err != nil {
		m.log.Warn("clearing clients of removed endpoints from the affinity map", zap.Error(err))
	}
}

// clearStaleFlows deletes the conntrack entries of UDP flows whose
// endpoint left their frontend, so their next datagram picks a live one:
// one read of the table per family with such flows.
func (m *Mode) clearStaleFlows(ctx context.Context, flows [2][]conntrack.Match) {
	if err := conntrack.DeleteMatchingByFamily(ctx, m.ct, flows); err != nil {
		m.log.Warn("clearing conntrack entries of removed UDP endpoints", zap.Error(err))
	}
}

// UnservedCleared counts the conntrack entries of packets that reached a
// frontend before it was served that the syncs deleted
// (conntrack.Served.Clear).
func (m *Mode) UnservedCleared() uint64 { return m.served.Cleared() }

// ConntrackDeleted counts the conntrack entries of family the syncs
// deleted: those UnservedCleared counts, and the UDP flows of removed
// endpoints.
func (m *Mode) ConntrackDeleted(family netfilter.Family) uint64 { return m.ct.Deleted(family) }

// Cleanup removes the mode's tables, also when another process wrote them.
func (m *Mode) Cleanup(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cur = nil
	m.served.Reset()
	var errs []error
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		if err := m.k.Delete(ctx, fam); err != nil {
			errs = append(errs, fmt.Errorf("deleting the %v table %s: %w", fam, Table, err))
		}
	}
	return errors.Join(errs...)
}

// Close does nothing: the tables stay for a successor, or for --cleanup.
func (m *Mode) Close(ctx context.Context, handedOver bool) error { return nil }

// Available reports why this node cannot run the mode, or nil.
func (m *Mode) Available(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, fam := range m.families {
		if err := m.k.Probe(ctx, fam); err != nil {
			return fmt.Errorf("nftables mode unavailable (%v): %w", fam, err)
		}
	}
	return nil
}
