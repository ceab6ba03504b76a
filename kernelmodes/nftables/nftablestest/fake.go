// Package nftablestest owns the in-memory nf_tables of the nftables mode's
// tests: a Fake kernel that keeps each family's layout and elements, and a
// packet tracer that answers "a packet from A to B:port goes where?" from
// them, as the mode's fixed rules would (see the nftables package doc).
package nftablestest

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"sync"

	"github.com/svcproxy/svcproxy/kernelmodes/nftables"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/nftable"
)

// Fake is an in-memory Kernel. Its zero value is not usable: use New.
type Fake struct {
	mu     sync.Mutex
	tables map[netfilter.Family]*table
	calls  []string
	// Fail, if set, is returned by the next Update (then cleared).
	Fail error
}

type table struct {
	layout nftables.Layout
	sets   nftables.Tables
}

// New returns an empty Fake.
func New() *Fake { return &Fake{tables: map[netfilter.Family]*table{}} }

// Calls returns the calls made so far, as "Setup ip", "Update ip -3 +64", ...
func (f *Fake) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// ResetCalls forgets the calls made so far.
func (f *Fake) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = nil
}

// Setup makes l's table and sets exist (the fake keeps no rules: its
// tracer runs the layout). A table whose layout differs from l is not
// intact: its rules would differ.
func (f *Fake) Setup(_ context.Context, l nftables.Layout, rewrite bool) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("Setup %v", l.Family))
	t := f.tables[l.Family]
	intact := t != nil
	if t == nil {
		t = &table{sets: nftables.Tables{}}
		f.tables[l.Family] = t
	}
	names := append(l.ElementSets(), nftables.SetAffinity)
	for _, s := range names {
		if t.sets[s] == nil {
			intact = false
			t.sets[s] = nftables.Elements{}
		}
	}
	for s := range t.sets { // affinity sets of timeouts gone
		if !slices.Contains(names, s) {
			intact = false
			delete(t.sets, s)
		}
	}
	if !reflect.DeepEqual(t.layout, l) {
		intact = false // the rules differ
	}
	t.layout = l
	return intact, nil
}

func (f *Fake) Elements(_ context.Context, fam netfilter.Family, set string) (nftables.Elements, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tables[fam]
	if t == nil || t.sets[set] == nil {
		return nil, fmt.Errorf("no set %s in the %v table", set, fam)
	}
	return maps.Clone(t.sets[set]), nil
}

// Update applies deletions then additions, all or nothing, as one
// transaction would: deleting an element that is not there, or adding one
// whose key holds another value, fails it.
func (f *Fake) Update(_ context.Context, fam netfilter.Family, del, add []nftables.Element) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("Update %v -%d +%d", fam, len(del), len(add)))
	if err := f.Fail; err != nil {
		f.Fail = nil
		return err
	}
	t := f.tables[fam]
	if t == nil {
		return fmt.Errorf("no %v table", fam)
	}
	next := nftables.Tables{}
	for s, els := range t.sets {
		next[s] = maps.Clone(els)
	}
	for _, e := range del {
		els := next[e.Set]
		if v, ok := els[e.Key]; !ok || v != e.Val {
			return fmt.Errorf("deleting an element of %s that is not there", e.Set)
		}
		delete(els, e.Key)
	}
	for _, e := range add {
		els := next[e.Set]
		if els == nil {
			return fmt.Errorf("no set %s", e.Set)
		}
		if len(e.Key) != nftables.KeyLen(fam, e.Set) {
			return fmt.Errorf("an element of %s with a %d-byte key, want %d", e.Set, len(e.Key), nftables.KeyLen(fam, e.Set))
		}
		if v, ok := els[e.Key]; ok && v != e.Val {
			return fmt.Errorf("adding an element of %s whose key holds another value", e.Set)
		}
		els[e.Key] = e.Val
	}
	t.sets = next
	return nil
}

func (f *Fake) Delete(_ context.Context, fam netfilter.Family) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("Delete %v", fam))
	delete(f.tables, fam)
	return nil
}

func (f *Fake) Probe(context.Context, netfilter.Family) error { return nil }

// Tamper runs edit on fam's sets, as another process changing the table.
func (f *Fake) Tamper(fam netfilter.Family, edit func(nftables.Tables)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t := f.tables[fam]; t != nil {
		edit(t.sets)
	}
}

// Count is how many elements fam's set holds.
func (f *Fake) Count(fam netfilter.Family, set string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t := f.tables[fam]; t != nil {
		return len(t.sets[set])
	}
	return 0
}

// Remember records in fam's affinity map that client's connections to dst
// go to ep, as the kernel's postrouting rule does after a DNAT.
func (f *Fake) Remember(fam netfilter.Family, client netip.Addr, proto lb.Protocol, dst, ep netip.AddrPort) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t := f.tables[fam]; t != nil {
		t.sets[nftables.SetAffinity][nftable.AffinityKey(client, dst.Addr(), proto, dst.Port())] = nftable.EndpointValue(ep)
	}
}

// Packet is a new connection's first packet.
type Packet struct {
	Src   netip.Addr
	Dst   netip.AddrPort
	Proto lb.Protocol
	// Local says Dst's address is one of the node's (fib daddr type local).
	Local bool
	// LocalSource says Src is one of the node's addresses (fib saddr type
	// local): the node's own connection.
	LocalSource bool
}

// Verdict is what the table does with a Packet.
type Verdict struct {
	// DNAT are the endpoints it may be DNATed to, sorted, each with how many
	// of the frontend's slots lead to it; empty if not DNATed.
	DNAT []Share
	// Masquerade says the connection is masqueraded on its way out (for a
	// hairpin, when the endpoint chosen is Src itself: see Hairpin).
	Masquerade bool
	// Hairpin are the endpoints among DNAT that masquerade because they
	// are Src.
	Hairpin []netip.AddrPort
	// Reject says the packet is rejected (TCP reset or ICMP unreachable).
	Reject bool
	// Affinity is the timeout (seconds) for which the endpoint a new
	// connection goes to is remembered for its client; 0: none.
	Affinity uint32
	// Remembered says DNAT is the endpoint the affinity map remembers.
	Remembered bool
}

// Share is an endpoint and the slots that pick it: Slots of Of.
type Share struct {
	Endpoint netip.AddrPort
	Slots    int
	Of       int
}

func (v Verdict) String() string {
	switch {
	case v.Reject:
		return "reject"
	case len(v.DNAT) == 0:
		return "pass"
	}
	s := fmt.Sprintf("dnat %v", v.DNAT)
	if v.Masquerade {
		s += " masquerade"
	}
	if len(v.Hairpin) > 0 {
		s += fmt.Sprintf(" hairpin %v", v.Hairpin)
	}
	if v.Remembered {
		s += " remembered"
	}
	if v.Affinity > 0 {
		s += fmt.Sprintf(" affinity %ds", v.Affinity)
	}
	return s
}

// Trace follows p through fam's table as the rules do.
func (f *Fake) Trace(fam netfilter.Family, p Packet) Verdict {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tables[fam]
	var v Verdict
	if t == nil {
		return v
	}
	l, sets := t.layout, t.sets
	fe := nftable.FrontendKey(p.Dst.Addr(), p.Proto, p.Dst.Port())
	np := nftable.NodePortKey(p.Proto, p.Dst.Port())
	// shares follows the slots map to the chain that draws one of m slots,
	// then counts the endpoints of those slots (a slot without an element
	// is a connection that goes on un-DNATed).
	shares := func(slotsSet, set, key string, first int) []Share {
		m := nftables.SlotsOf(sets[slotsSet][key])
		count := map[netip.AddrPort]int{}
		for i := range m {
			if val, ok := sets[set][nftable.SlotKey(key, first+i)]; ok {
				ep, _ := nftable.DecodeEndpoint(fam, val)
				count[ep]++
			}
		}
		var out []Share
		for ep, n := range count {
			out = append(out, Share{ep, n, m})
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Endpoint.Compare(out[j].Endpoint) < 0 })
		return out
	}
	has := func(set, key string) bool { _, ok := sets[set][key]; return ok }
	nodePortAddr := func() bool {
		a := p.Dst.Addr()
		if !p.Local || !l.NodePorts || a.IsLoopback() {
			return false
		}
		if len(l.NodePortPrefixes) == 0 {
			return true
		}
		for _, pr := range l.NodePortPrefixes {
			if pr.Contains(a) {
				return true
			}
		}
		return false
	}
	// nat: services, then nodeports.
	if has(nftables.SetMasquerade, fe) {
		v.Masquerade = true
	}
	if l.ClusterCIDR.IsValid() && !l.ClusterCIDR.Contains(p.Src) && has(nftables.SetMasqueradeOffCluster, fe) {
		v.Masquerade = true
	}
	if p.LocalSource && has(nftables.SetShortCircuit, fe) {
		v.Masquerade = true
	}
	// inside: a pod or the node, which a short circuit serves.
	inside := p.LocalSource || l.ClusterCIDR.IsValid() && l.ClusterCIDR.Contains(p.Src)
	remembered := func() []Share {
		if len(l.AffinityTimeouts) == 0 {
			return nil
		}
		val, ok := sets[nftables.SetAffinity][nftable.AffinityKey(p.Src, p.Dst.Addr(), p.Proto, p.Dst.Port())]
		if !ok {
			return nil
		}
		v.Remembered = true
		ep, _ := nftable.DecodeEndpoint(fam, val)
		return []Share{{ep, 1, 1}}
	}
	// pick: the short circuit's slots for a client inside that has one,
	// else (or when its slot has no element: the goto falls off the end
	// back into services) the frontend's own.
	pick := func(shortSlots, slotsSet, set, key string) []Share {
		if inside && has(shortSlots, key) {
			if s := shares(shortSlots, set, key, nftables.ShortSlot); len(s) > 0 {
				return s
			}
		}
		return shares(slotsSet, set, key, 0)
	}
	if v.DNAT = remembered(); len(v.DNAT) == 0 {
		v.DNAT = pick(nftables.SetShortCircuitSlots, nftables.SetServiceSlots, nftables.SetServiceEndpoints, fe)
	}
	if len(v.DNAT) == 0 && nodePortAddr() {
		if has(nftables.SetNodePortMasquerade, np) || p.LocalSource && has(nftables.SetNodePortShortCircuit, np) {
			v.Masquerade = true
		}
		if v.DNAT = remembered(); len(v.DNAT) == 0 {
			v.DNAT = pick(nftables.SetNodePortShortCircuitSlots, nftables.SetNodePortSlots, nftables.SetNodePortEndpoints, np)
		}
	}
	if len(v.DNAT) > 0 {
		for _, secs := range l.AffinityTimeouts {
			if has(nftables.AffinitySet(secs), fe) || (nodePortAddr() && has(nftables.AffinityNodePortSet(secs), np)) {
				v.Affinity = secs
			}
		}
	}
	if len(v.DNAT) > 0 {
		for _, s := range v.DNAT {
			if s.Endpoint.Addr() == p.Src && has(nftables.SetHairpin, nftable.AddrPairKey(p.Src)) {
				v.Hairpin = append(v.Hairpin, s.Endpoint)
			}
		}
		return v
	}
	v.Masquerade = false
	// filter: reject what has no endpoints.
	v.Reject = has(nftables.SetNoEndpoints, fe) || (nodePortAddr() && has(nftables.SetNodePortNoEndpoints, np))
	return v
}
