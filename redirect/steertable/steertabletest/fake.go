// Package steertabletest holds the in-memory steertable.Kernel and its
// packet tracer: redirect's tests run the same behavioural table over it
// and over netfiltertest's iptables fake.
package steertabletest

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
	"github.com/svcproxy/svcproxy/netfilter/nftable"
	"github.com/svcproxy/svcproxy/redirect/steertable"
)

// table is one family's table.
type table struct {
	layout steertable.Layout
	sets   map[string]map[string]string
}

// Fake is an in-memory steertable.Kernel. Its methods are safe for
// concurrent use.
type Fake struct {
	mu      sync.Mutex
	tables  [2]*table
	calls   map[string]int
	fail    map[string]error
	noProbe error
}

// NewFake returns an empty Fake.
func NewFake() *Fake { return &Fake{calls: map[string]int{}, fail: map[string]error{}} }

// Fail makes every later call of op ("setup", "elements", "update",
// "delete", "probe") fail with err; nil heals it.
func (f *Fake) Fail(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.fail, op)
	} else {
		f.fail[op] = err
	}
}

// Count is how many times op was called.
func (f *Fake) Count(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

func (f *Fake) call(op string) error {
	f.calls[op]++
	return f.fail[op]
}

func (f *Fake) Setup(ctx context.Context, l steertable.Layout) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("setup"); err != nil {
		return false, err
	}
	t := f.tables[l.Family]
	intact := t != nil && len(t.sets) == len(steertable.Sets) && t.layout.Family == l.Family &&
		t.layout.Mark == l.Mark && t.layout.NodePorts == l.NodePorts && slices.Equal(t.layout.NodePortPrefixes, l.NodePortPrefixes) &&
		slices.Equal(t.layout.ClusterCIDRs, l.ClusterCIDRs) && t.layout.To == l.To
	if t == nil {
		t = &table{sets: map[string]map[string]string{}}
		f.tables[l.Family] = t
	}
	t.layout = l
	for _, s := range steertable.Sets {
		if t.sets[s] == nil {
			t.sets[s] = map[string]string{}
			intact = false
		}
	}
	return intact, nil
}

func (f *Fake) Elements(ctx context.Context, fam netfilter.Family, set string) (map[string]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("elements"); err != nil {
		return nil, err
	}
	t := f.tables[fam]
	if t == nil || t.sets[set] == nil {
		return nil, fmt.Errorf("no set %s in the %v table", set, fam)
	}
	return maps.Clone(t.sets[set]), nil
}

// Update checks each element as the kernel would: deleting one that is not
// there, or adding one that is, fails the whole transaction.
func (f *Fake) Update(ctx context.Context, fam netfilter.Family, del, add []nftable.Element) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(del)+len(add) == 0 {
		return nil
	}
	if err := f.call("update"); err != nil {
		return err
	}
	t := f.tables[fam]
	if t == nil {
		return fmt.Errorf("no %v table", fam)
	}
	next := map[string]map[string]string{}
	for s, es := range t.sets {
		next[s] = maps.Clone(es)
	}
	for _, e := range del {
		if _, ok := next[e.Set][e.Key]; !ok {
			return fmt.Errorf("deleting element %x of %s: not there", e.Key, e.Set)
		}
		delete(next[e.Set], e.Key)
	}
	for _, e := range add {
		es := next[e.Set]
		if es == nil {
			return fmt.Errorf("adding to %s: no such set", e.Set)
		}
		if _, ok := es[e.Key]; ok {
			return fmt.Errorf("adding element %x to %s: already there", e.Key, e.Set)
		}
		if steertable.IsMap(e.Set) != (e.Val != "") {
			return fmt.Errorf("adding element %x to %s: value %x does not fit the set", e.Key, e.Set, e.Val)
		}
		es[e.Key] = e.Val
	}
	t.sets = next
	return nil
}

func (f *Fake) Delete(ctx context.Context, fam netfilter.Family) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("delete"); err != nil {
		return err
	}
	f.tables[fam] = nil
	return nil
}

func (f *Fake) Probe(ctx context.Context, l steertable.Layout) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.call("probe")
}

// Has reports whether fam's table exists.
func (f *Fake) Has(fam netfilter.Family) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tables[fam] != nil
}

// Len is how many elements fam's set holds.
func (f *Fake) Len(fam netfilter.Family, set string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t := f.tables[fam]; t != nil {
		return len(t.sets[set])
	}
	return 0
}

// Tamper deletes every element of fam's set, or the whole table when set
// is "", behind the Redirector's back.
func (f *Fake) Tamper(fam netfilter.Family, set string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tables[fam]
	switch {
	case t == nil:
	case set == "":
		f.tables[fam] = nil
	default:
		clear(t.sets[set])
	}
}

func isLocal(p netfiltertest.Packet) bool { return local(p, p.Dst.Addr()) }

// local says whether a is one of the node's addresses (fib … type local).
func local(p netfiltertest.Packet, a netip.Addr) bool {
	return a.IsLoopback() || slices.Contains(p.LocalAddrs, a)
}

// inside says whether p comes from inside the cluster in l: the node, or
// a pod (l.ClusterCIDRs).
func inside(l steertable.Layout, p netfiltertest.Packet) bool {
	return local(p, p.Src.Addr()) || slices.ContainsFunc(l.ClusterCIDRs, func(pr netip.Prefix) bool { return pr.Contains(p.Src.Addr()) })
}

// nodePortAddr says whether p's destination serves NodePorts in l.
func nodePortAddr(l steertable.Layout, p netfiltertest.Packet) bool {
	if !l.NodePorts || !isLocal(p) {
		return false
	}
	if len(l.NodePortPrefixes) == 0 {
		return true
	}
	return slices.ContainsFunc(l.NodePortPrefixes, func(pr netip.Prefix) bool { return pr.Contains(p.Dst.Addr()) })
}

// Trace follows p through the table of its family as the kernel runs the
// layout in the steertable package doc: the steer chain (nat prerouting or
// output), then the reject chain (filter) unless the packet was
// redirected. Rule names the chain and set that decided.
func (f *Fake) Trace(p netfiltertest.Packet) netfiltertest.Verdict {
	f.mu.Lock()
	defer f.mu.Unlock()
	accept := netfiltertest.Verdict{Action: netfiltertest.Accept}
	fam := netfilter.FamilyOf(p.Dst.Addr())
	t := f.tables[fam]
	if t == nil {
		return accept
	}
	l := t.layout
	if l.Mark != 0 && p.Mark&l.Mark == l.Mark {
		return accept
	}
	fe := nftable.FrontendKey(p.Dst.Addr(), p.Proto, p.Dst.Port())
	np := nftable.NodePortKey(p.Proto, p.Dst.Port())
	redirected := func(set, v string) netfiltertest.Verdict {
		port, _ := nftable.DecodePort(v)
		if l.To.IsValid() {
			return netfiltertest.Verdict{Action: netfiltertest.DNAT, Dst: netip.AddrPortFrom(l.To, port), Rule: "steer: dnat to " + l.To.String() + " : map @" + set}
		}
		return netfiltertest.Verdict{Action: netfiltertest.Redirect, Port: port, Rule: "steer: redirect to : map @" + set}
	}
	// steer
	if v, ok := t.sets[steertable.SetFrontends][fe]; ok {
		return redirected(steertable.SetFrontends, v)
	}
	if v, ok := t.sets[steertable.SetShortCircuit][fe]; ok && inside(l, p) {
		return redirected(steertable.SetShortCircuit, v)
	}
	_, dead := t.sets[steertable.SetNoEndpoints][fe]
	if !dead && nodePortAddr(l, p) {
		if v, ok := t.sets[steertable.SetNodePorts][np]; ok {
			return redirected(steertable.SetNodePorts, v)
		}
		if v, ok := t.sets[steertable.SetNodePortShortCircuit][np]; ok && inside(l, p) {
			return redirected(steertable.SetNodePortShortCircuit, v)
		}
	}
	// reject
	if dead {
		return netfiltertest.Verdict{Action: netfiltertest.Reject, Rule: "reject: @" + steertable.SetNoEndpoints}
	}
	if _, ok := t.sets[steertable.SetNodePortNoEndpoints][np]; ok && nodePortAddr(l, p) {
		return netfiltertest.Verdict{Action: netfiltertest.Reject, Rule: "reject: @" + steertable.SetNodePortNoEndpoints}
	}
	if _, ok := t.sets[steertable.SetUDPSockets][nftable.PortValue(p.Dst.Port())]; ok && p.Proto == lb.UDP && isLocal(p) {
		return netfiltertest.Verdict{Action: netfiltertest.Drop, Rule: "reject: udp dport @" + steertable.SetUDPSockets}
	}
	return accept
}

// Dump lists the tables' layouts and elements, for failure messages.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for fam, t := range f.tables {
		if t == nil {
			continue
		}
		fmt.Fprintf(&b, "table %v %s %+v\n", netfilter.Family(fam), steertable.Table, t.layout)
		for _, s := range steertable.Sets {
			keys := slices.Collect(maps.Keys(t.sets[s]))
			sort.Strings(keys)
			fmt.Fprintf(&b, "  %s:", s)
			for _, k := range keys {
				fmt.Fprintf(&b, " %x", k)
				if v := t.sets[s][k]; v != "" {
					fmt.Fprintf(&b, "→%x", v)
				}
			}
			b.WriteByte('\n')
		}
	}
	return b.String()
}
