package iptables

import (
	"context"
	"slices"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// state is what one Apply leaves in the kernel: every Service port's rules
// per family, and the snapshot they were computed from, which the next plan
// asks what changed since (lb.Snapshot.Changed).
type state struct {
	snap *lb.Snapshot
	svcs map[lb.ServicePortName]*svcState
}

// svcState is one Service port as last written. The next plan reuses it
// unless the snapshot reports the port updated.
type svcState struct {
	key   string // the Service port's name: its Parts' key
	rules [2]svcRules
	parts [2]*netfilter.Part
}

// change is one Service port that changed: old is nil when it is new, new is
// nil when it is gone.
type change struct{ old, new *svcState }

// plan computes the next state from snap, reusing the Services that did not
// change since prev (which may be nil), and lists the changes. What changed
// is the snapshot's to say (lb.Snapshot.Changed: a port's Service, pools,
// or the frontends and NodePort it owns after conflicts); plan recomputes
// only those ports.
func (m *Mode) plan(snap *lb.Snapshot, prev *state) (*state, []change) {
	next := &state{snap: snap, svcs: make(map[lb.ServicePortName]*svcState, snap.Len())}
	var diff lb.Diff
	var updated map[lb.ServicePortName]bool
	if prev != nil {
		diff = snap.Changed(prev.snap)
		updated = make(map[lb.ServicePortName]bool, len(diff.Updated))
		for _, name := range diff.Updated {
			updated[name] = true
		}
	}
	var changes []change
	for _, bal := range snap.Balancers() {
		if bal == nil || bal.Service == nil {
			continue
		}
		name := bal.Service.Name
		var old *svcState
		if prev != nil {
			old = prev.svcs[name]
		}
		if old != nil && !updated[name] {
			next.svcs[name] = old
			continue
		}
		s := &svcState{key: name.String()}
		for _, fam := range m.families {
			s.rules[fam] = m.compute(snap, bal, fam)
		}
		next.svcs[name] = s
		if old != nil && sameRules(old, s) {
			s.parts = old.parts // the Reconciler skips what it wrote already
			continue
		}
		for _, fam := range m.families {
			s.parts[fam] = s.rules[fam].part(fam)
		}
		changes = append(changes, change{old, s})
	}
	for _, name := range diff.Removed {
		if old := prev.svcs[name]; old != nil {
			changes = append(changes, change{old, nil})
		}
	}
	return next, changes
}

func sameRules(a, b *svcState) bool {
	for fam := range a.rules {
		x, y := &a.rules[fam], &b.rules[fam]
		if !slices.Equal(x.services, y.services) || !slices.Equal(x.nodePorts, y.nodePorts) ||
			!slices.Equal(x.reject, y.reject) || !slices.Equal(x.npReject, y.npReject) ||
			!slices.Equal(x.hairpin, y.hairpin) || !slices.Equal(x.udpFlows, y.udpFlows) ||
			!slices.EqualFunc(x.chains, y.chains, func(c, d ownedChain) bool { return c.name == d.name && slices.Equal(c.rules, d.rules) }) {
			return false
		}
	}
	return true
}

// ruleset is st as the Reconciler takes it: the fixed chains, the jumps
// into them, a Part per Service port and the sets.
func (m *Mode) ruleset(st *state) *netfilter.Ruleset {
	rs := netfilter.NewRuleset(m.families...)
	for _, fam := range m.families {
		rs.Chains[fam] = m.fixed[fam]
		rs.Entries[fam] = ourJumps
		parts := make(map[string]*netfilter.Part, len(st.svcs))
		for _, s := range st.svcs {
			parts[s.key] = s.parts[fam]
		}
		rs.Parts[fam] = parts
		hp := netfilter.SetDef{Name: hairpinSet(fam), Type: netfilter.SetIPPortIP, Family: fam}
		rs.Sets[hp.Name] = hp.With(nil)
		if m.npRestricted[fam] && m.nodePorts[fam] {
			np := netfilter.SetDef{Name: npAddrsSet(fam), Type: netfilter.SetNet, Family: fam}
			rs.Sets[np.Name] = np.With(m.npMembers[fam])
		}
	}
	return rs
}

// clearStaleFlows deletes the conntrack entries of UDP flows whose endpoint
// a change took from their frontend: without it, a flow's datagrams keep
// going to the removed endpoint until the entry times out, where the
// userspace mode would pick a live endpoint for the next datagram. (TCP
// connections to a removed endpoint are left to end, as kube-proxy does.)
// One read of the table per family with such flows. Failures are logged,
// not returned: the rules are right either way.
func (m *Mode) clearStaleFlows(ctx context.Context, changes []change) {
	var stale [2][]conntrack.Match
	for _, fam := range m.families {
		for _, c := range changes {
			if c.old == nil {
				continue
			}
			var now []conntrack.Match
			if c.new != nil {
				now = c.new.rules[fam].udpFlows
			}
			for _, f := range c.old.rules[fam].udpFlows {
				if !slices.Contains(now, f) {
					stale[fam] = append(stale[fam], f)
				}
			}
		}
	}
	if err := conntrack.DeleteMatchingByFamily(ctx, m.ct, stale); err != nil {
		m.log.Warn("clearing conntrack entries of removed UDP endpoints", zap.Error(err))
	}
}
