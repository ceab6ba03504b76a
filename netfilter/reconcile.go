package netfilter

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Tools is what a Reconciler runs: the rule and set half of Executor.
// Every Executor is one; so is the IPVS mode's narrower Rules.
type Tools interface {
	IPTablesRestore(ctx context.Context, family Family, data []byte) error
	IPTablesSave(ctx context.Context, family Family, table string) ([]byte, error)
	IPSetRestore(ctx context.Context, data []byte) error
	IPSetSave(ctx context.Context) ([]byte, error)
	IPSetDestroy(ctx context.Context, name string) error
}

// ReconcilerConfig configures a Reconciler.
type ReconcilerConfig struct {
	Tools Tools
	// ChainPrefix and SetPrefix name what the owner owns: a full sync
	// prunes chains, jumps into them and sets so named that the Ruleset
	// does not want.
	ChainPrefix, SetPrefix string
	// Repaired, when set, is called by a full sync that found the kernel
	// differing from what was last written (tampering), with the
	// differences, before it repairs them.
	Repaired func(diffs []string)
}

// Reconciler makes the kernel hold a Ruleset: the one place svcproxy reads,
// diffs, writes and prunes its iptables chains and ipsets. Its methods are
// safe for concurrent use; calls are serialised.
//
// An incremental Sync diffs the wanted Ruleset against the one it last
// wrote successfully and writes only the difference: the chains whose rules
// changed (Parts' rules in shared chains deleted and inserted one by one),
// new and removed chains, set member additions and deletions; one
// iptables-restore per family that changed and one ipset restore, no read.
// A full Sync reads what the owner owns (iptables-save, ipset save), counts
// a repair when it differs from what was last written, swaps in every set
// whose members differ through a temporary set, rewrites every owned chain
// and the jumps into them, deletes duplicate and foreign jumps into owned
// chains, and prunes owned chains and sets the Ruleset does not want. The
// first Sync, and every Sync after a failed one, is full.
type Reconciler struct {
	cfg      ReconcilerConfig
	restores RestoreFailures
	repairs  atomic.Uint64

	mu sync.Mutex
	// written is what the last successful Sync wrote; nil when nothing
	// was, or a full sync failed (the kernel state is then unknown).
	written *Ruleset
	// attempt is what a failed incremental Sync was writing: the kernel
	// may hold parts of it, which is no tampering.
	attempt *Ruleset
	// counts are, per set, how many of written's Parts hold each member.
	counts map[string]map[string]int
	dirty  bool // a Sync failed: the next one is full
}

// NewReconciler returns a Reconciler that has written nothing yet.
func NewReconciler(cfg ReconcilerConfig) *Reconciler {
	return &Reconciler{cfg: cfg}
}

// Repairs counts full syncs that found tampering and repaired it.
func (r *Reconciler) Repairs() uint64 { return r.repairs.Load() }

// RestoreFailures counts the failed iptables-restore runs for family.
func (r *Reconciler) RestoreFailures(family Family) uint64 { return r.restores.Count(family) }

// Forget drops what the Reconciler knows it wrote (after a Cleanup): the
// next Sync is full and counts no repair.
func (r *Reconciler) Forget() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.written, r.attempt, r.counts, r.dirty = nil, nil, nil, true
}

// Sync makes the kernel hold want; full reads and repairs everything.
// want must not change afterwards (the next incremental Sync diffs against
// it). When it fails, the next Sync is full.
func (r *Reconciler) Sync(ctx context.Context, want *Ruleset, full bool) error {
	if want == nil {
		return errors.New("syncing rules: nil ruleset")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if full || r.dirty || r.written == nil || !r.incremental(want) {
		if err := r.full(ctx, want); err != nil {
			r.written, r.attempt, r.counts, r.dirty = nil, nil, nil, true
			return err
		}
		r.counts = want.memberCounts()
	} else if err := r.partial(ctx, want); err != nil {
		r.attempt, r.dirty = want, true
		return err
	}
	r.written, r.attempt, r.dirty = want, nil, false
	return nil
}

// incremental reports whether an incremental sync can write want: the
// same families and set definitions as last written.
func (r *Reconciler) incremental(want *Ruleset) bool {
	if !slices.Equal(want.Families, r.written.Families) {
		return false
	}
	for name, s := range want.Sets {
		if o := r.written.Sets[name]; o != nil && !o.sameDef(s) {
			return false
		}
	}
	return true
}

// partial writes what differs between r.written and want.
func (r *Reconciler) partial(ctx context.Context, want *Ruleset) error {
	old := r.written
	var scripts [2]*script
	delta := map[string]map[string]int{}
	for _, f := range want.Families {
		sc := newScript()
		rewrite := map[ChainKey]bool{}
		for k, rules := range want.Chains[f] {
			if o, ok := old.Chains[f][k]; !ok || !slices.Equal(o, rules) {
				rewrite[k] = true
			}
		}
		for k := range old.Chains[f] {
			if _, ok := want.Chains[f][k]; !ok {
				sc.remove(k)
			}
		}
		for key, p := range want.Parts[f] {
			if o := old.Parts[f][key]; o != p {
				partDiff(sc, want.Chains[f], o, p, rewrite, delta)
			}
		}
		for key, o := range old.Parts[f] {
			if _, ok := want.Parts[f][key]; !ok {
				partDiff(sc, want.Chains[f], o, nil, rewrite, delta)
			}
		}
		if len(rewrite) > 0 {
			heads := map[ChainKey][]string{}
			for _, p := range want.Parts[f] {
				for k, rs := range p.Rules {
					if rewrite[k] {
						heads[k] = append(heads[k], rs...)
					}
				}
			}
			for k := range rewrite {
				h := heads[k]
				slices.Sort(h)
				sc.fill(k, append(h, want.Chains[f][k]...))
			}
		}
		if !slices.Equal(old.Entries[f], want.Entries[f]) {
			for _, e := range old.Entries[f] {
				if !slices.Contains(want.Entries[f], e) {
					sc.del[e.Table] = append(sc.del[e.Table], "-D "+e.From+" "+e.spec())
				}
			}
			for _, e := range want.Entries[f] {
				if !slices.Contains(old.Entries[f], e) {
					sc.add[e.Table] = append(sc.add[e.Table], e.insert())
				}
			}
		}
		scripts[f] = sc
	}

	// Sets: new ones, then member changes; removed ones go after the rules.
	var lines []string
	for name, s := range want.Sets {
		if old.Sets[name] == nil {
			lines = append(lines, s.createLine(name, 0))
		}
	}
	slices.Sort(lines)
	var changes []string
	for name, s := range want.Sets {
		var om map[string]struct{}
		if o := old.Sets[name]; o != nil {
			om = o.Members
		}
		d := delta[name]
		same := sameMap(om, s.Members)
		if len(d) == 0 && same {
			continue
		}
		// Every member that may have come or gone: fixed ones that
		// changed, and those whose Parts changed.
		cand := maps.Clone(d)
		if cand == nil {
			cand = map[string]int{}
		}
		if !same {
			for m := range s.Members {
				if _, ok := om[m]; !ok {
					cand[m] += 0
				}
			}
			for m := range om {
				if _, ok := s.Members[m]; !ok {
					cand[m] += 0
				}
			}
		}
		c := r.counts[name]
		if c == nil {
			c = map[string]int{}
			if r.counts == nil {
				r.counts = map[string]map[string]int{}
			}
			r.counts[name] = c
		}
		for m, n := range cand {
			_, inOld := om[m]
			_, inNew := s.Members[m]
			before := inOld || c[m] > 0
			if c[m] += n; c[m] <= 0 {
				delete(c, m)
			}
			switch after := inNew || c[m] > 0; {
			case !before && after:
				changes = append(changes, "add "+name+" "+numericProto(m))
			case before && !after:
				changes = append(changes, "del "+name+" "+numericProto(m))
			}
		}
	}
	for name := range r.counts {
		if want.Sets[name] == nil {
			delete(r.counts, name)
		}
	}
	slices.Sort(changes)
	if lines = append(lines, changes...); len(lines) > 0 {
		if err := r.cfg.Tools.IPSetRestore(ctx, []byte(strings.Join(lines, "\n")+"\n")); err != nil {
			return fmt.Errorf("updating ipsets: %w", err)
		}
	}
	for _, f := range want.Families {
		if scripts[f].empty() {
			continue
		}
		if err := r.restores.Restore(ctx, r.cfg.Tools, f, scripts[f].bytes()); err != nil {
			return fmt.Errorf("updating %v rules: %w", f, err)
		}
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(old.Sets)) {
		if want.Sets[name] == nil {
			errs = append(errs, DestroySet(ctx, r.cfg.Tools, name))
		}
	}
	return errors.Join(errs...)
}

func sameMap(a, b map[string]struct{}) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			return false
		}
	}
	return true
}

// partDiff adds to sc what turns Part o into p (either may be nil), but
// for the chains in rewrite, which are written whole, and counts its set
// member changes in delta.
func partDiff(sc *script, shared map[ChainKey][]string, o, p *Part, rewrite map[ChainKey]bool, delta map[string]map[string]int) {
	if o == nil {
		o = &Part{}
	}
	if p == nil {
		p = &Part{}
	}
	for k, rules := range p.Chains {
		if or, ok := o.Chains[k]; ok && slices.Equal(or, rules) {
			continue
		}
		sc.fill(k, rules)
	}
	for k := range o.Chains {
		if _, ok := p.Chains[k]; !ok {
			sc.remove(k)
		}
	}
	for _, k := range unionKeys(o.Rules, p.Rules) {
		if rewrite[k] {
			continue
		}
		gone, added := diff(o.Rules[k], p.Rules[k])
		for _, x := range gone {
			sc.del[k.Table] = append(sc.del[k.Table], "-D "+k.Chain+" "+x)
		}
		ins := "-A " + k.Chain + " "
		if len(shared[k]) > 0 {
			ins = "-I " + k.Chain + " 1 " // the chain's own rules stay last
		}
		for _, x := range added {
			sc.add[k.Table] = append(sc.add[k.Table], ins+x)
		}
	}
	for _, set := range unionKeys(o.Members, p.Members) {
		gone, added := diff(o.Members[set], p.Members[set])
		d := delta[set]
		if d == nil && len(gone)+len(added) > 0 {
			d = map[string]int{}
			delta[set] = d
		}
		for _, m := range gone {
			d[m]--
		}
		for _, m := range added {
			d[m]++
		}
	}
}

func unionKeys[K comparable, V any](a, b map[K]V) []K {
	out := make([]K, 0, len(a)+len(b))
	for k := range a {
		out = append(out, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	return out
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

func (e Entry) insert() string {
	if e.Append {
		return "-A " + e.From + " " + e.spec()
	}
	return "-I " + e.From + " 1 " + e.spec()
}

// foundSet is one owned set as `ipset save` shows it.
type foundSet struct {
	typ       string
	family    Family
	hasFamily bool
	members   []string // canonical, sorted
}

// readSets reads every set named with the set prefix.
func (r *Reconciler) readSets(ctx context.Context) (map[string]*foundSet, error) {
	out, err := r.cfg.Tools.IPSetSave(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading ipsets: %w", err)
	}
	sets := map[string]*foundSet{}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.HasPrefix(f[1], r.cfg.SetPrefix) {
			continue
		}
		switch f[0] {
		case "create":
			s := &foundSet{typ: f[2]}
			if i := slices.Index(f, "family"); i > 0 && i+1 < len(f) {
				s.hasFamily = true
				if f[i+1] == "inet6" {
					s.family = IPv6
				}
			}
			sets[f[1]] = s
		case "add":
			if s := sets[f[1]]; s != nil {
				s.members = append(s.members, canonMember(s, f[2])...)
			}
		}
	}
	for _, s := range sets {
		slices.Sort(s.members)
	}
	return sets, nil
}

// canonMember is m as `ipset save` prints it for a set of s's type.
func canonMember(s *foundSet, m string) []string {
	switch s.typ {
	case SetIP, SetIPPort, SetIPPortIP, SetNet, SetPort:
		if c, err := CanonicalMembers(s.typ, s.family, m); err == nil {
			return c
		}
	default:
		return []string{m}
	}
	return []string{"unparsable:" + m}
}

// mine reports whether a found set belongs to the families of rs: a set of
// a family the owner no longer programs stays (the other family's rules may
// still use it) until a Cleanup.
func (s *foundSet) mine(rs *Ruleset) bool { return !s.hasFamily || rs.has(s.family) }

// full reads, compares, rewrites and prunes.
func (r *Reconciler) full(ctx context.Context, want *Ruleset) error {
	sets, err := r.readSets(ctx)
	if err != nil {
		return err
	}
	var owned [2]map[string]*Owned
	read := func() error {
		for _, f := range want.Families {
			if owned[f], err = ReadOwnedTables(ctx, r.cfg.Tools, f, r.cfg.ChainPrefix); err != nil {
				return err
			}
		}
		return nil
	}
	if err := read(); err != nil {
		return err
	}
	if r.written != nil && slices.Equal(r.written.Families, want.Families) {
		if diffs := r.differs(owned, sets, r.written, r.attempt); len(diffs) > 0 {
			r.repairs.Add(1)
			if r.cfg.Repaired != nil {
				r.cfg.Repaired(diffs)
			}
		}
	}
	// A set of another type or family cannot be swapped: drop the rules
	// that reference it (they are rewritten below), then the set.
	var incompatible []string
	for _, name := range slices.Sorted(maps.Keys(want.Sets)) {
		s, o := want.Sets[name], sets[name]
		if o != nil && (o.typ != s.Type || (s.Type != SetPort && o.family != s.Family)) {
			incompatible = append(incompatible, name)
		}
	}
	if len(incompatible) > 0 {
		for _, f := range want.Families {
			if err := RemoveOwned(ctx, r.cfg.Tools, f, r.cfg.ChainPrefix); err != nil {
				return err
			}
		}
		for _, name := range incompatible {
			if err := DestroySet(ctx, r.cfg.Tools, name); err != nil {
				return err
			}
			delete(sets, name)
		}
		if err := read(); err != nil {
			return err
		}
	}

	// Sets first: the rules reference them. One whose members differ is
	// filled as a temporary set and swapped in, so packets never see it
	// half-filled.
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(want.Sets)) {
		s, o := want.Sets[name], sets[name]
		mem := want.members(name)
		if o != nil && slices.Equal(o.members, mem) {
			continue
		}
		tmp := tmpSet(name)
		if o == nil {
			b.WriteString(s.createLine(name, len(mem)) + "\n")
		}
		if sets[tmp] != nil {
			b.WriteString("destroy " + tmp + "\n")
			delete(sets, tmp)
		}
		b.WriteString(s.createLine(tmp, len(mem)) + "\n")
		for _, m := range mem {
			b.WriteString("add " + tmp + " " + numericProto(m) + "\n")
		}
		b.WriteString("swap " + tmp + " " + name + "\ndestroy " + tmp + "\n")
	}
	if b.Len() > 0 {
		if err := r.cfg.Tools.IPSetRestore(ctx, []byte(b.String())); err != nil {
			return fmt.Errorf("writing ipsets: %w", err)
		}
	}

	for _, f := range want.Families {
		all, _ := want.chains(f)
		sc := newScript()
		for _, k := range slices.SortedFunc(maps.Keys(all), compareKeys) {
			sc.fill(k, all[k])
		}
		var found []foundJump
		for _, tbl := range OwnedTables {
			for name := range owned[f][tbl].Chains {
				if _, ok := all[ChainKey{tbl, name}]; !ok {
					sc.remove(ChainKey{tbl, name})
				}
			}
			for _, j := range owned[f][tbl].Jumps {
				found = append(found, foundJump{tbl, j})
			}
		}
		keep, del := entryPlan(f, want.Entries[f], found)
		for _, j := range del {
			sc.del[j.table] = append(sc.del[j.table], "-D "+j.Chain+" "+j.Spec)
		}
		for _, e := range want.Entries[f] {
			if !keep[e] {
				sc.add[e.Table] = append(sc.add[e.Table], e.insert())
			}
		}
		if err := r.restores.Restore(ctx, r.cfg.Tools, f, sc.bytes()); err != nil {
			return fmt.Errorf("writing %v rules: %w", f, err)
		}
	}

	// Sets no rule references any more.
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(sets)) {
		if want.Sets[name] == nil && sets[name].mine(want) {
			errs = append(errs, DestroySet(ctx, r.cfg.Tools, name))
		}
	}
	return errors.Join(errs...)
}

func compareKeys(a, b ChainKey) int {
	if c := strings.Compare(a.Table, b.Table); c != 0 {
		return c
	}
	return strings.Compare(a.Chain, b.Chain)
}

type foundJump struct {
	table string
	Jump
}

// entryPlan splits the jumps found into the wanted entries (kept, once
// each) and the rest (duplicates, foreign ones: to delete).
func entryPlan(f Family, want []Entry, found []foundJump) (keep map[Entry]bool, del []foundJump) {
	keep = map[Entry]bool{}
	for _, j := range found {
		i := slices.IndexFunc(want, func(e Entry) bool {
			return e.Table == j.table && e.From == j.Chain && e.To == j.Target && sameRule(f, j.Rule, e.spec())
		})
		if i >= 0 && !keep[want[i]] {
			keep[want[i]] = true
			continue
		}
		del = append(del, j)
	}
	return keep, del
}

// entryDiffs lists the wanted entries missing from the jumps found, and
// the jumps found that are not wanted.
func entryDiffs(f Family, want []Entry, found []foundJump) []string {
	var diffs []string
	keep, del := entryPlan(f, want, found)
	for _, e := range want {
		if !keep[e] {
			diffs = append(diffs, fmt.Sprintf("%v jump %s %s -> %s missing", f, e.Table, e.From, e.To))
		}
	}
	for _, j := range del {
		diffs = append(diffs, fmt.Sprintf("%v stray rule %s %s %s", f, j.table, j.Chain, j.Spec))
	}
	return diffs
}

// sameRule compares a rule read back (canonical) with one wanted.
func sameRule(f Family, got, want string) bool {
	if got == want {
		return true
	}
	c, err := Canonical(f, want)
	return err == nil && c == got
}

// sameChain compares rules read back with wanted ones. tail >= 0 marks a
// chain Parts add to: its head compares as a multiset, its last tail rules
// in order.
func sameChain(f Family, got, want []string, tail int, shared bool) bool {
	if len(got) != len(want) {
		return false
	}
	if !shared {
		for i := range got {
			if !sameRule(f, got[i], want[i]) {
				return false
			}
		}
		return true
	}
	n := len(got) - tail
	if n < 0 || !sameChain(f, got[n:], want[n:], 0, false) {
		return false
	}
	g, w := slices.Clone(got[:n]), slices.Clone(want[:n])
	slices.Sort(g)
	slices.Sort(w)
	if slices.Equal(g, w) {
		return true
	}
	for i := range w {
		if c, err := Canonical(f, w[i]); err == nil {
			w[i] = c
		}
	}
	slices.Sort(w)
	return slices.Equal(g, w)
}

// differs lists how what was read differs from st, what was last
// written. When alt is set (an incremental sync to alt failed part way),
// what matches alt instead is no difference either: that sync wrote it.
func (r *Reconciler) differs(owned [2]map[string]*Owned, sets map[string]*foundSet, st, alt *Ruleset) []string {
	var diffs []string
	for _, f := range st.Families {
		want, tails := st.chains(f)
		var altWant map[ChainKey][]string
		var altTails map[ChainKey]int
		if alt != nil {
			altWant, altTails = alt.chains(f)
		}
		got := map[ChainKey][]string{}
		var found []foundJump
		for _, tbl := range OwnedTables {
			for name, rs := range owned[f][tbl].Chains {
				got[ChainKey{tbl, name}] = rs
			}
			for _, j := range owned[f][tbl].Jumps {
				found = append(found, foundJump{tbl, j})
			}
		}
		same := func(k ChainKey, g, w []string, tails map[ChainKey]int) bool {
			t, shared := tails[k]
			return sameChain(f, g, w, t, shared)
		}
		for k, w := range want {
			g, ok := got[k]
			a, inAlt := altWant[k]
			switch {
			case !ok && alt != nil && !inAlt:
			case !ok:
				diffs = append(diffs, fmt.Sprintf("%v %s chain %s missing", f, k.Table, k.Chain))
			case !same(k, g, w, tails) && !(inAlt && same(k, g, a, altTails)):
				diffs = append(diffs, fmt.Sprintf("%v %s chain %s changed", f, k.Table, k.Chain))
			}
		}
		for k, g := range got {
			if _, ok := want[k]; ok {
				continue
			}
			if a, ok := altWant[k]; ok && same(k, g, a, altTails) {
				continue
			}
			diffs = append(diffs, fmt.Sprintf("%v %s chain %s is not ours", f, k.Table, k.Chain))
		}
		diffs = append(diffs, entryDiffs(f, st.Entries[f], found)...)
	}
	for name := range st.Sets {
		o := sets[name]
		if o == nil {
			diffs = append(diffs, "set "+name+" missing")
			continue
		}
		w := st.members(name)
		var a []string
		if alt != nil {
			a = alt.members(name)
		}
		if !slices.Equal(o.members, w) && !between(o.members, w, a, alt != nil) {
			diffs = append(diffs, fmt.Sprintf("set %s has %d members, want %d (or different ones)", name, len(o.members), len(w)))
		}
	}
	for name, o := range sets {
		if _, ok := st.Sets[name]; !ok && o.mine(st) {
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

// chainSaver reads single chains and set names: what Check needs beyond
// Tools (every Executor has it).
type chainSaver interface {
	IPTablesSaveChains(ctx context.Context, family Family, table string, chains []string) ([]byte, error)
	IPSetNames(ctx context.Context) ([]string, error)
}

// Check compares a cheap read with what was last written: the Ruleset's
// own chains (Chains, with the Parts' rules in them), the built-in chains
// holding the entries, and that every set exists. It reads those few
// chains (`iptables -S`), not the tables, so it can run where a full sync
// of 10,000 Services costs seconds; it misses a Part's own chain or a set
// member changed behind its back. It needs Tools that can read single
// chains (an Executor), and a successful Sync before it.
func (r *Reconciler) Check(ctx context.Context) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cs, ok := r.cfg.Tools.(chainSaver)
	if !ok {
		return nil, errors.New("checking rules: the tools cannot read single chains")
	}
	st := r.written
	if st == nil || r.dirty {
		return nil, errors.New("checking rules: nothing written")
	}
	var diffs []string
	for _, f := range st.Families {
		all, tails := st.chains(f)
		var found []foundJump
		for _, tbl := range OwnedTables {
			var chains []string
			for _, e := range st.Entries[f] {
				if e.Table == tbl && !slices.Contains(chains, e.From) {
					chains = append(chains, e.From)
				}
			}
			for k := range st.Chains[f] {
				if k.Table == tbl {
					chains = append(chains, k.Chain)
				}
			}
			slices.Sort(chains)
			out, err := cs.IPTablesSaveChains(ctx, f, tbl, chains)
			if err != nil {
				return nil, fmt.Errorf("reading %v %s chains: %w", f, tbl, err)
			}
			got, err := ReadOwned(f, tbl, out, r.cfg.ChainPrefix)
			if err != nil {
				return nil, fmt.Errorf("parsing %v %s chains: %w", f, tbl, err)
			}
			for k := range st.Chains[f] {
				if k.Table != tbl {
					continue
				}
				t, shared := tails[k]
				switch g, ok := got.Chains[k.Chain]; {
				case !ok:
					diffs = append(diffs, fmt.Sprintf("%v %s chain %s missing", f, tbl, k.Chain))
				case !sameChain(f, g, all[k], t, shared):
					diffs = append(diffs, fmt.Sprintf("%v %s chain %s changed", f, tbl, k.Chain))
				}
			}
			for _, j := range got.Jumps {
				found = append(found, foundJump{tbl, j})
			}
		}
		diffs = append(diffs, entryDiffs(f, st.Entries[f], found)...)
	}
	names, err := cs.IPSetNames(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing ipsets: %w", err)
	}
	for name := range st.Sets {
		if !slices.Contains(names, name) {
			diffs = append(diffs, "set "+name+" missing")
		}
	}
	slices.Sort(diffs)
	return diffs, nil
}
