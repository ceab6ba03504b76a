package iptables

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// state is what one Apply leaves in the kernel: every Service port's rules
// per family, and how many Services use each hairpin set member.
type state struct {
	svcs    map[lb.ServicePortName]*svcState
	hairpin [2]map[string]int
}

// svcState is one Service port as last written. A Balancer that is the same
// pointer as last time, with the same frontends routed to it, has not
// changed (the Store builds a new Balancer for every update).
type svcState struct {
	bal   *lb.Balancer
	own   uint64
	rules [2]svcRules
}

// change is one Service port that changed: old is nil when it is new, new is
// nil when it is gone.
type change struct{ old, new *svcState }

// plan computes the next state from snap, reusing the Services that did not
// change since prev (which may be nil), and lists the changes.
func (m *Mode) plan(snap *lb.Snapshot, prev *state) (*state, []change) {
	next := &state{svcs: make(map[lb.ServicePortName]*svcState, snap.Len())}
	if prev != nil {
		next.hairpin = prev.hairpin // adjusted by partialSync, rebuilt by fullSync
	}
	var changes []change
	for _, bal := range snap.Balancers() {
		if bal == nil || bal.Service == nil {
			continue
		}
		name := bal.Service.Name
		own := ownership(snap, bal)
		var old *svcState
		if prev != nil {
			old = prev.svcs[name]
		}
		if old != nil && old.bal == bal && old.own == own && own&(1<<63) == 0 {
			next.svcs[name] = old
			continue
		}
		s := &svcState{bal: bal, own: own}
		for _, fam := range m.families {
			s.rules[fam] = m.compute(snap, bal, fam)
		}
		next.svcs[name] = s
		if old == nil || !sameRules(old, s) {
			changes = append(changes, change{old, s})
		}
	}
	if prev != nil {
		for name, old := range prev.svcs {
			if _, ok := next.svcs[name]; !ok {
				changes = append(changes, change{old, nil})
			}
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

// partialSync writes the changes: the changed Services' chains are declared
// (flushed) and refilled, removed ones deleted, and their rules in the
// shared chains deleted and inserted one by one (-D/-I by rule
// specification), so the 10,000-rule dispatch chain is never rewritten.
// Hairpin set members a change adds go in before the rules, the ones it
// removes after.
func (m *Mode) partialSync(ctx context.Context, changes []change, next *state) error {
	var sets strings.Builder
	scripts := [2][]byte{}
	for _, fam := range m.families {
		if next.hairpin[fam] == nil {
			return errors.New("no hairpin member counts: a full sync is needed")
		}
		var decl, del, add, drop []string
		var fdel, fadd []string
		delta := map[string]int{}
		for _, c := range changes {
			var o, n *svcRules
			if c.old != nil {
				o = &c.old.rules[fam]
			} else {
				o = &svcRules{}
			}
			if c.new != nil {
				n = &c.new.rules[fam]
			} else {
				n = &svcRules{}
			}
			oldChains := map[string][]string{}
			for _, ch := range o.chains {
				oldChains[ch.name] = ch.rules
			}
			newNames := map[string]bool{}
			for _, ch := range n.chains {
				newNames[ch.name] = true
				if rs, ok := oldChains[ch.name]; ok && slices.Equal(rs, ch.rules) {
					continue
				}
				decl = append(decl, ":"+ch.name+" - [0:0]")
				for _, r := range ch.rules {
					add = append(add, "-A "+ch.name+" "+r)
				}
			}
			for _, ch := range o.chains {
				if !newNames[ch.name] {
					decl = append(decl, ":"+ch.name+" - [0:0]")
					drop = append(drop, "-X "+ch.name)
				}
			}
			for _, k := range listChains {
				gone, added := diff(o.list(k), n.list(k))
				// Deleted and inserted by specification; the dispatch
				// chain's new rules go first, as the NodePorts jump must
				// stay last.
				ins := "-A " + k.chain + " "
				if k.chain == chainServices {
					ins = "-I " + k.chain + " 1 "
				}
				d, a := &del, &add
				if k.table == "filter" {
					d, a = &fdel, &fadd
				}
				for _, r := range gone {
					*d = append(*d, "-D "+k.chain+" "+r)
				}
				for _, r := range added {
					*a = append(*a, ins+r)
				}
			}
			gone, added := diff(o.hairpin, n.hairpin)
			for _, mem := range added {
				delta[mem]++
			}
			for _, mem := range gone {
				delta[mem]--
			}
		}
		// A member may move from one Service to another in one sync: only
		// the net change of its users decides.
		refs := next.hairpin[fam]
		for _, mem := range sortedKeys(delta) {
			before := refs[mem]
			after := before + delta[mem]
			switch {
			case after <= 0:
				delete(refs, mem)
			default:
				refs[mem] = after
			}
			switch {
			case before == 0 && after > 0:
				fmt.Fprintf(&sets, "add %s %s\n", hairpinSet(fam), numericProto(mem))
			case before > 0 && after <= 0:
				fmt.Fprintf(&sets, "del %s %s\n", hairpinSet(fam), numericProto(mem))
			}
		}
		var b strings.Builder
		if len(decl)+len(del)+len(add)+len(drop) > 0 {
			fmt.Fprintf(&b, "*nat\n")
			writeLines(&b, decl, del, add, drop)
			b.WriteString("COMMIT\n")
		}
		if len(fdel)+len(fadd) > 0 {
			fmt.Fprintf(&b, "*filter\n")
			writeLines(&b, fdel, fadd)
			b.WriteString("COMMIT\n")
		}
		scripts[fam] = []byte(b.String())
	}
	// Hairpin members first: a new endpoint's is there before traffic can
	// reach it. (A removed endpoint's goes a moment before its rules: a
	// connection it makes to itself meanwhile is not masqueraded. It is
	// going away; one exec less per change is worth more.)
	if sets.Len() > 0 {
		if err := m.exec.IPSetRestore(ctx, []byte(sets.String())); err != nil {
			return fmt.Errorf("updating hairpin members: %w", err)
		}
	}
	for _, fam := range m.families {
		if len(scripts[fam]) == 0 {
			continue
		}
		if err := m.restores.Restore(ctx, m.exec, fam, scripts[fam]); err != nil {
			return fmt.Errorf("updating %v rules: %w", fam, err)
		}
	}
	return nil
}

// numericProto writes a hash:ip,port,ip member with its protocol as a
// number: ipset then skips a getprotobyname per member, which halves the
// CPU a 100,000-member restore costs. ipset prints it with the name.
func numericProto(mem string) string {
	if i := strings.Index(mem, ",tcp:"); i >= 0 {
		return mem[:i] + ",6:" + mem[i+5:]
	}
	if i := strings.Index(mem, ",udp:"); i >= 0 {
		return mem[:i] + ",17:" + mem[i+5:]
	}
	return mem
}

// clearStaleFlows deletes the conntrack entries of UDP flows whose endpoint
// a change took from their frontend: without it, a flow's datagrams keep
// going to the removed endpoint until the entry times out, where the
// userspace mode would pick a live endpoint for the next datagram. (TCP
// connections to a removed endpoint are left to end, as kube-proxy does.)
// Failures are logged, not returned: the rules are right either way.
func (m *Mode) clearStaleFlows(ctx context.Context, changes []change) {
	for _, fam := range m.families {
		seen := map[netfilter.ConntrackFilter]bool{}
		for _, c := range changes {
			if c.old == nil {
				continue
			}
			var now []udpFlow
			if c.new != nil {
				now = c.new.rules[fam].udpFlows
			}
			for _, f := range c.old.rules[fam].udpFlows {
				if slices.Contains(now, f) {
					continue
				}
				filter := netfilter.ConntrackFilter{Proto: lb.UDP, OrigDst: f.front.Addr(), OrigDstPort: f.front.Port(), ReplySrc: f.ep}
				if seen[filter] {
					continue
				}
				seen[filter] = true
				if err := m.exec.ConntrackDelete(ctx, fam, filter); err != nil {
					m.log.Warn("clearing conntrack entries of a removed UDP endpoint", zap.Stringer("flows", filter), zap.Error(err))
				}
			}
		}
	}
}

// diff returns what is in a but not b, and in b but not a.
func diff(a, b []string) (gone, added []string) {
	for _, x := range a {
		if !slices.Contains(b, x) {
			gone = append(gone, x)
		}
	}
	for _, x := range b {
		if !slices.Contains(a, x) {
			added = append(added, x)
		}
	}
	return gone, added
}

func writeLines(b *strings.Builder, groups ...[]string) {
	for _, g := range groups {
		for _, l := range g {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
}

// desiredChains is every chain st needs in family fam, with its rules: the
// fixed chains (desiredFixed) and the Services' own chains.
func (m *Mode) desiredChains(st *state, fam netfilter.Family) map[chainKey][]string {
	out := m.desiredFixed(st, fam)
	for _, s := range st.svcs {
		for _, ch := range s.rules[fam].chains {
			out[chainKey{"nat", ch.name}] = ch.rules
		}
	}
	return out
}

// desiredFixed is the fixed chains st needs in family fam: listChains with
// every Service's rules, sorted, then the fixed tail; the others as they
// are.
func (m *Mode) desiredFixed(st *state, fam netfilter.Family) map[chainKey][]string {
	out := make(map[chainKey][]string, 2*len(st.svcs)+8)
	heads := map[chainKey][]string{}
	for _, s := range st.svcs {
		r := &s.rules[fam]
		for _, k := range listChains {
			heads[k] = append(heads[k], r.list(k)...)
		}
	}
	for k, rules := range m.fixed[fam] {
		if slices.Contains(listChains, k) {
			h := heads[k]
			slices.Sort(h)
			rules = append(h, rules...)
		}
		out[k] = rules
	}
	return out
}

// check compares what a cheap read finds with st (what the last sync
// wrote): the fixed chains, the built-in chains that jump into them, and
// that every wanted set exists. It reads a few small chains (the dispatch
// chain is the big one: a rule per frontend), not the tables, so it can run
// every sync period where a full sync of 10,000 Services costs seconds. It
// misses a Service's own chain or a set member changed behind its back;
// the hourly full sync finds those.
func (m *Mode) check(ctx context.Context, st *state) ([]string, error) {
	var diffs []string
	for _, fam := range m.families {
		want := m.desiredFixed(st, fam)
		var jumps []jumpRule
		for _, tbl := range []string{"nat", "filter"} {
			var chains []string
			for _, j := range ourJumps {
				if j.table == tbl && !slices.Contains(chains, j.from) {
					chains = append(chains, j.from)
				}
			}
			for k := range m.fixed[fam] {
				if k.table == tbl {
					chains = append(chains, k.chain)
				}
			}
			slices.Sort(chains)
			out, err := m.exec.IPTablesSaveChains(ctx, fam, tbl, chains)
			if err != nil {
				return nil, fmt.Errorf("reading %v %s chains: %w", fam, tbl, err)
			}
			got, err := netfilter.ReadOwned(fam, tbl, out, chainPrefix)
			if err != nil {
				return nil, fmt.Errorf("parsing %v %s chains: %w", fam, tbl, err)
			}
			for k, w := range want {
				if k.table != tbl {
					continue
				}
				switch g, ok := got.Chains[k.chain]; {
				case !ok:
					diffs = append(diffs, fmt.Sprintf("%v %s chain %s missing", fam, tbl, k.chain))
				case !m.sameChain(fam, k, g, w):
					diffs = append(diffs, fmt.Sprintf("%v %s chain %s changed", fam, tbl, k.chain))
				}
			}
			for _, j := range got.Jumps {
				if !strings.HasPrefix(j.Chain, chainPrefix) {
					jumps = append(jumps, jumpRule{tbl, j})
				}
			}
		}
		keep, del := jumpPlan(jumps)
		for _, j := range ourJumps {
			if !keep[j] {
				diffs = append(diffs, fmt.Sprintf("%v jump %s %s -> %s missing", fam, j.table, j.from, j.to))
			}
		}
		for _, j := range del {
			diffs = append(diffs, fmt.Sprintf("%v stray rule %s %s %s", fam, j.table, j.Chain, j.Spec))
		}
	}
	names, err := m.exec.IPSetNames(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing ipsets: %w", err)
	}
	for _, d := range m.wantedSets() {
		if !slices.Contains(names, d.name) {
			diffs = append(diffs, "set "+d.name+" missing")
		}
	}
	slices.Sort(diffs)
	return diffs, nil
}

// observed is what a full sync found in the kernel.
type observed struct {
	fam     [2]*owned
	sets    map[string]bool     // every svcproxy-dnat- set
	members map[string][]string // canonical members of each wanted set that exists
}

// owned is a family's SVCPROXY-DNAT- chains and the jumps into them.
type owned struct {
	chains map[chainKey][]string
	jumps  []jumpRule
}

type jumpRule struct {
	table string
	netfilter.Jump
}

func (m *Mode) readRules(ctx context.Context, fam netfilter.Family) (*owned, error) {
	tables, err := netfilter.ReadOwnedTables(ctx, m.exec, fam, chainPrefix)
	if err != nil {
		return nil, err
	}
	o := &owned{chains: map[chainKey][]string{}}
	for _, tbl := range netfilter.OwnedTables {
		got := tables[tbl]
		for name, rs := range got.Chains {
			o.chains[chainKey{tbl, name}] = rs
		}
		for _, j := range got.Jumps { // ReadOwned reports no jumps from owned chains
			o.jumps = append(o.jumps, jumpRule{tbl, j})
		}
	}
	return o, nil
}

func (m *Mode) observe(ctx context.Context) (*observed, error) {
	o := &observed{sets: map[string]bool{}, members: map[string][]string{}}
	for _, fam := range m.families {
		r, err := m.readRules(ctx, fam)
		if err != nil {
			return nil, err
		}
		o.fam[fam] = r
	}
	names, err := m.exec.IPSetNames(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing ipsets: %w", err)
	}
	for _, n := range names {
		if strings.HasPrefix(n, setPrefix) && (m.cfg.IPv6 || !strings.HasSuffix(strings.TrimSuffix(n, "-tmp"), "-v6")) {
			o.sets[n] = true
		}
	}
	for _, d := range m.wantedSets() {
		if !o.sets[d.name] {
			continue
		}
		raw, err := m.exec.IPSetList(ctx, d.name)
		if errors.Is(err, netfilter.ErrNoSet) {
			delete(o.sets, d.name)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listing ipset %s: %w", d.name, err)
		}
		ms := make([]string, 0, len(raw))
		for _, mem := range raw {
			c, err := netfilter.CanonicalMembers(d.typ, d.fam, mem)
			if err != nil {
				c = []string{"unparsable:" + mem}
			}
			ms = append(ms, c...)
		}
		o.members[d.name] = ms
	}
	return o, nil
}

// jumpPlan splits the jumps found into our wanted ones (kept, once each)
// and the rest (to delete).
func jumpPlan(found []jumpRule) (keep map[jump]bool, del []jumpRule) {
	keep = map[jump]bool{}
	for _, j := range found {
		k := jump{j.table, j.Chain, j.Target}
		if j.Plain && slices.Contains(ourJumps, k) && !keep[k] {
			keep[k] = true
			continue
		}
		del = append(del, j)
	}
	return keep, del
}

// sameChain compares rules found with wanted ones; listChains compare as
// multisets followed by their fixed tail.
func (m *Mode) sameChain(fam netfilter.Family, k chainKey, got, want []string) bool {
	if !slices.Contains(listChains, k) {
		return slices.Equal(got, want)
	}
	tail := m.fixed[fam][k]
	if len(got) != len(want) || len(got) < len(tail) || !slices.Equal(got[len(got)-len(tail):], tail) {
		return false
	}
	g := slices.Clone(got[:len(got)-len(tail)])
	w := slices.Clone(want[:len(want)-len(tail)])
	slices.Sort(g)
	slices.Sort(w)
	return slices.Equal(g, w)
}

// wantedMembers are the members st puts in each wanted set.
func (m *Mode) wantedMembers(st *state) map[string][]string {
	out := map[string][]string{}
	for _, fam := range m.families {
		seen := map[string]bool{}
		var hp []string
		for _, s := range st.svcs {
			for _, mem := range s.rules[fam].hairpin {
				if !seen[mem] {
					seen[mem] = true
					hp = append(hp, mem)
				}
			}
		}
		slices.Sort(hp)
		out[hairpinSet(fam)] = hp
		if m.npRestricted[fam] && m.nodePorts[fam] {
			var np []string
			for _, p := range m.npAddrs[fam] {
				s := p.String()
				if p.IsSingleIP() {
					s = p.Addr().String()
				}
				np = append(np, s)
			}
			slices.Sort(np)
			out[npAddrsSet(fam)] = np
		}
	}
	return out
}

// differs lists how o differs from what st says was written. When alt is
// set (an incremental sync to alt failed part way), what matches alt
// instead is not a difference either: that sync wrote it.
func (m *Mode) differs(o *observed, st, alt *state) []string {
	var diffs []string
	for _, fam := range m.families {
		want := m.desiredChains(st, fam)
		var altWant map[chainKey][]string
		if alt != nil {
			altWant = m.desiredChains(alt, fam)
		}
		got := o.fam[fam].chains
		for k, w := range want {
			g, ok := got[k]
			a, inAlt := altWant[k]
			switch {
			case !ok && alt != nil && !inAlt:
			case !ok:
				diffs = append(diffs, fmt.Sprintf("%v %s chain %s missing", fam, k.table, k.chain))
			case !m.sameChain(fam, k, g, w) && !(inAlt && m.sameChain(fam, k, g, a)):
				diffs = append(diffs, fmt.Sprintf("%v %s chain %s changed", fam, k.table, k.chain))
			}
		}
		for k, g := range got {
			if _, ok := want[k]; ok {
				continue
			}
			if a, ok := altWant[k]; ok && m.sameChain(fam, k, g, a) {
				continue
			}
			diffs = append(diffs, fmt.Sprintf("%v %s chain %s is not ours", fam, k.table, k.chain))
		}
		keep, del := jumpPlan(o.fam[fam].jumps)
		for _, j := range ourJumps {
			if !keep[j] {
				diffs = append(diffs, fmt.Sprintf("%v jump %s %s -> %s missing", fam, j.table, j.from, j.to))
			}
		}
		for _, j := range del {
			diffs = append(diffs, fmt.Sprintf("%v stray rule %s %s %s", fam, j.table, j.Chain, j.Spec))
		}
	}
	wantSets := m.wantedMembers(st)
	var altSets map[string][]string
	if alt != nil {
		altSets = m.wantedMembers(alt)
	}
	for name, w := range wantSets {
		if !o.sets[name] {
			diffs = append(diffs, "set "+name+" missing")
			continue
		}
		g := slices.Clone(o.members[name])
		slices.Sort(g)
		if !slices.Equal(g, w) && !between(g, w, altSets[name], alt != nil) {
			diffs = append(diffs, fmt.Sprintf("set %s has %d members, want %d (or different ones)", name, len(g), len(w)))
		}
	}
	for name := range o.sets {
		if _, ok := wantSets[name]; !ok {
			diffs = append(diffs, "set "+name+" is not ours")
		}
	}
	slices.Sort(diffs)
	return diffs
}

// between reports whether the sorted members got could be a partial change
// from a to b: everything in both is there, nothing in neither.
func between(got, a, b []string, ok bool) bool {
	if !ok {
		return false
	}
	for _, x := range got {
		if _, inA := slices.BinarySearch(a, x); !inA {
			if _, inB := slices.BinarySearch(b, x); !inB {
				return false
			}
		}
	}
	for _, x := range a {
		if _, inB := slices.BinarySearch(b, x); inB {
			if _, in := slices.BinarySearch(got, x); !in {
				return false
			}
		}
	}
	return true
}

// fullSync rewrites everything next needs and prunes what it does not. It
// counts a repair when the kernel differs from prev (what was last
// written; nil: unknown, nothing to compare), or, after a failed
// incremental sync to next (failed true), from both.
func (m *Mode) fullSync(ctx context.Context, next, prev *state, failed bool) error {
	start := time.Now()
	o, err := m.observe(ctx)
	if err != nil {
		return err
	}
	if prev != nil {
		var alt *state
		if failed {
			alt = next
		}
		if diffs := m.differs(o, prev, alt); len(diffs) > 0 {
			m.repairs.Add(1)
			m.log.Warn("rules or sets were changed behind svcproxy's back; repairing",
				zap.Strings("differences", diffs[:min(len(diffs), 10)]), zap.Int("count", len(diffs)))
		}
	}
	observed := time.Since(start)

	// Sets first: the rules reference them. Each is filled as a
	// temporary set and swapped in, so packets never see it half-filled.
	members := m.wantedMembers(next)
	var b strings.Builder
	for _, d := range m.wantedSets() {
		mem := members[d.name]
		tmp := d.name + "-tmp"
		if !o.sets[d.name] {
			b.WriteString(d.createLine(d.name, len(mem)) + "\n")
		}
		if o.sets[tmp] {
			b.WriteString("destroy " + tmp + "\n")
		}
		b.WriteString(d.createLine(tmp, len(mem)) + "\n")
		for _, x := range mem {
			fmt.Fprintf(&b, "add %s %s\n", tmp, numericProto(x))
		}
		fmt.Fprintf(&b, "swap %s %s\ndestroy %s\n", tmp, d.name, tmp)
		delete(o.sets, tmp)
	}
	if err := m.exec.IPSetRestore(ctx, []byte(b.String())); err != nil {
		return fmt.Errorf("writing ipsets: %w", err)
	}
	next.hairpin = [2]map[string]int{}
	for _, fam := range m.families {
		refs := map[string]int{}
		for _, s := range next.svcs {
			for _, mem := range s.rules[fam].hairpin {
				refs[mem]++
			}
		}
		next.hairpin[fam] = refs
	}

	var rules int
	for _, fam := range m.families {
		want := m.desiredChains(next, fam)
		var script strings.Builder
		keep, del := jumpPlan(o.fam[fam].jumps)
		for _, tbl := range []string{"nat", "filter"} {
			var decl, extra, stale []string
			for k := range want {
				if k.table == tbl {
					decl = append(decl, k.chain)
				}
			}
			for k := range o.fam[fam].chains {
				if _, ok := want[k]; !ok && k.table == tbl {
					stale = append(stale, k.chain)
				}
			}
			slices.Sort(decl)
			slices.Sort(stale)
			for _, j := range del {
				if j.table == tbl {
					extra = append(extra, "-D "+j.Chain+" "+j.Spec)
				}
			}
			for _, j := range ourJumps {
				if j.table == tbl && !keep[j] {
					extra = append(extra, "-I "+j.from+" 1 -j "+j.to)
				}
			}
			fmt.Fprintf(&script, "*%s\n", tbl)
			for _, c := range slices.Concat(decl, stale) {
				fmt.Fprintf(&script, ":%s - [0:0]\n", c)
			}
			writeLines(&script, extra)
			for _, c := range decl {
				for _, r := range want[chainKey{tbl, c}] {
					script.WriteString("-A " + c + " " + r + "\n")
					rules++
				}
			}
			for _, c := range stale {
				script.WriteString("-X " + c + "\n")
			}
			script.WriteString("COMMIT\n")
		}
		if err := m.restores.Restore(ctx, m.exec, fam, []byte(script.String())); err != nil {
			return fmt.Errorf("writing %v rules: %w", fam, err)
		}
	}

	// Sets no rule references any more.
	var errs []error
	wanted := m.wantedSets()
	for name := range o.sets {
		if !slices.ContainsFunc(wanted, func(d setDef) bool { return d.name == name }) {
			if err := netfilter.DestroySet(ctx, m.exec, name); err != nil {
				errs = append(errs, err)
			}
		}
	}
	m.log.Debug("full sync", zap.Int("services", len(next.svcs)), zap.Int("rules", rules),
		zap.Duration("read", observed), zap.Duration("duration", time.Since(start)))
	return errors.Join(errs...)
}
