package netfilter

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// ChainKey names a chain: its table and its name.
type ChainKey struct{ Table, Chain string }

// Entry is a rule in a built-in chain that jumps into an owned chain: the
// way packets enter a mode's rules.
type Entry struct {
	Table, From, To string
	// Match is the rule's matches before "-j To", in canonical form; ""
	// for a plain jump.
	Match string
	// Append puts the rule at the end of From; otherwise it goes first.
	Append bool
}

// Jumps returns plain jumps into chain to of table, at the top of each of
// the built-in chains from.
func Jumps(table, to string, from ...string) []Entry {
	out := make([]Entry, len(from))
	for i, f := range from {
		out[i] = Entry{Table: table, From: f, To: to}
	}
	return out
}

func (e Entry) spec() string {
	if e.Match == "" {
		return "-j " + e.To
	}
	return e.Match + " -j " + e.To
}

// SetDef defines an ipset.
type SetDef struct {
	Name   string
	Type   string // one of the Set* types
	Family Family // of the hash types; bitmap:port ignores it
	// MaxElem caps a hash set. Zero: twice the members, at least 65536.
	MaxElem int
}

// With returns the set d with members.
func (d SetDef) With(members map[string]struct{}) *Set { return &Set{SetDef: d, Members: members} }

// Set is one ipset a Ruleset wants.
type Set struct {
	SetDef
	// Members in `ipset save`'s form, besides those Parts add.
	Members map[string]struct{}
}

// Part is a piece of a Ruleset that changes on its own (one Service): its
// own chains, its rules in the Ruleset's shared chains and its set members.
// A Reconciler compares a Part with the one last written under the same
// key by pointer first, so a translator that keeps the Parts of what did
// not change makes an incremental sync cost what changed, not what is.
// A Part, like the whole Ruleset, must not change once synced.
type Part struct {
	// Chains of its own, with their rules.
	Chains map[ChainKey][]string
	// Rules it adds to chains of Ruleset.Chains. They come before that
	// chain's own rules (its tail), in any order: an incremental sync
	// deletes and inserts them one by one.
	Rules map[ChainKey][]string
	// Members it adds to sets of Ruleset.Sets, by set name. Several Parts
	// may add the same member; it goes when the last one drops it.
	Members map[string][]string
}

// Ruleset is everything one owner (redirect, a kernel mode) wants in
// netfilter: per family its chains and the entries into them, and the
// ipsets the rules use. Rules are in iptables-save's canonical form
// (Canonical), so a full sync can tell what it wrote from tampering.
type Ruleset struct {
	// Families the rules are written for.
	Families []Family
	// Chains are each family's owned chains with their rules (for a chain
	// Parts add rules to, the rules after theirs).
	Chains [2]map[ChainKey][]string
	// Entries are each family's jumps from built-in chains into Chains.
	Entries [2][]Entry
	// Parts are each family's independently changing pieces, by key.
	Parts [2]map[string]*Part
	// Sets by name (SetDef.Name).
	Sets map[string]*Set
}

// NewRuleset returns an empty Ruleset for families.
func NewRuleset(families ...Family) *Ruleset {
	rs := &Ruleset{Families: families, Sets: map[string]*Set{}}
	for _, f := range families {
		rs.Chains[f] = map[ChainKey][]string{}
		rs.Parts[f] = map[string]*Part{}
	}
	return rs
}

func (rs *Ruleset) has(f Family) bool { return slices.Contains(rs.Families, f) }

// chains returns every chain of family f with its whole rule list: Parts'
// rules in shared chains (sorted) before the chain's own, and the Parts'
// chains. shared lists the chains Parts add rules to, with their tails'
// lengths.
func (rs *Ruleset) chains(f Family) (all map[ChainKey][]string, tails map[ChainKey]int) {
	all = make(map[ChainKey][]string, len(rs.Chains[f])+2*len(rs.Parts[f]))
	heads := map[ChainKey][]string{}
	for _, p := range rs.Parts[f] {
		for k, c := range p.Chains {
			all[k] = c
		}
		for k, r := range p.Rules {
			heads[k] = append(heads[k], r...)
		}
	}
	tails = map[ChainKey]int{}
	for k, tail := range rs.Chains[f] {
		if h, ok := heads[k]; ok {
			slices.Sort(h)
			all[k] = append(h, tail...)
			tails[k] = len(tail)
			continue
		}
		all[k] = tail
	}
	return all, tails
}

// members returns the members of set name: its own and its Parts', sorted.
func (rs *Ruleset) members(name string) []string {
	s := rs.Sets[name]
	if s == nil {
		return nil
	}
	seen := maps.Clone(s.Members)
	if seen == nil {
		seen = map[string]struct{}{}
	}
	for _, f := range rs.Families {
		for _, p := range rs.Parts[f] {
			for _, m := range p.Members[name] {
				seen[m] = struct{}{}
			}
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// memberCounts counts, per set, the Parts holding each member.
func (rs *Ruleset) memberCounts() map[string]map[string]int {
	out := map[string]map[string]int{}
	for _, f := range rs.Families {
		for _, p := range rs.Parts[f] {
			for set, ms := range p.Members {
				c := out[set]
				if c == nil {
					c = map[string]int{}
					out[set] = c
				}
				for _, m := range ms {
					c[m]++
				}
			}
		}
	}
	return out
}

// InetName is f as ipset names it: "inet" or "inet6".
func InetName(f Family) string {
	if f == IPv6 {
		return "inet6"
	}
	return "inet"
}

// FamilySuffix is f as set names end: "v4" or "v6".
func FamilySuffix(f Family) string {
	if f == IPv6 {
		return "v6"
	}
	return "v4"
}

// createLine is the `ipset restore` line creating s under name for n
// members.
func (s *Set) createLine(name string, n int) string {
	if s.Type == SetPort {
		return fmt.Sprintf("create %s %s range 0-65535", name, s.Type)
	}
	hs := 1024
	for hs < n && hs < 1<<20 {
		hs <<= 1
	}
	me := s.MaxElem
	if me == 0 {
		me = max(65536, 2*n)
	}
	return fmt.Sprintf("create %s %s family %s hashsize %d maxelem %d", name, s.Type, InetName(s.Family), hs, me)
}

func (s *Set) sameDef(o *Set) bool {
	return s.Type == o.Type && (s.Type == SetPort || s.Family == o.Family) && s.MaxElem == o.MaxElem
}

// tmpSet is the set a full sync fills before swapping it in.
func tmpSet(name string) string { return name + "-t" }

// numericProto writes a hash:ip,port(,ip) member with its protocol as a
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

// script collects the lines of one iptables-restore input, per table, in
// the order iptables-restore needs them: chain declarations (which flush
// them), rule deletions, rule additions, chain removals.
type script struct {
	decl, del, add, drop map[string][]string
}

func newScript() *script {
	return &script{decl: map[string][]string{}, del: map[string][]string{}, add: map[string][]string{}, drop: map[string][]string{}}
}

func (s *script) declare(k ChainKey) {
	s.decl[k.Table] = append(s.decl[k.Table], ":"+k.Chain+" - [0:0]")
}

// fill declares chain k and appends rules to it.
func (s *script) fill(k ChainKey, rules []string) {
	s.declare(k)
	for _, r := range rules {
		s.add[k.Table] = append(s.add[k.Table], "-A "+k.Chain+" "+r)
	}
}

// remove flushes and deletes chain k.
func (s *script) remove(k ChainKey) {
	s.declare(k)
	s.drop[k.Table] = append(s.drop[k.Table], "-X "+k.Chain)
}

func (s *script) empty() bool {
	return len(s.decl)+len(s.del)+len(s.add)+len(s.drop) == 0
}

// bytes renders the input: nat then filter, each table that has lines,
// declarations and removals sorted.
func (s *script) bytes() []byte {
	var b strings.Builder
	for _, tbl := range OwnedTables {
		if len(s.decl[tbl])+len(s.del[tbl])+len(s.add[tbl])+len(s.drop[tbl]) == 0 {
			continue
		}
		slices.Sort(s.decl[tbl])
		s.decl[tbl] = slices.Compact(s.decl[tbl])
		slices.Sort(s.drop[tbl])
		b.WriteString("*" + tbl + "\n")
		for _, g := range [][]string{s.decl[tbl], s.del[tbl], s.add[tbl], s.drop[tbl]} {
			for _, l := range g {
				b.WriteString(l)
				b.WriteByte('\n')
			}
		}
		b.WriteString("COMMIT\n")
	}
	return []byte(b.String())
}

// Nat names chain in the nat table.
func Nat(chain string) ChainKey { return ChainKey{Table: "nat", Chain: chain} }

// Filter names chain in the filter table.
func Filter(chain string) ChainKey { return ChainKey{Table: "filter", Chain: chain} }

// AllChains returns every chain of family f with all its rules: the Parts'
// chains, and Chains with the Parts' rules (sorted) before their own.
func (rs *Ruleset) AllChains(f Family) map[ChainKey][]string {
	all, _ := rs.chains(f)
	return all
}

// MemberSets turns a translator's members (of a comparable type that
// prints in ipset's form) into a Ruleset's sets. It formats each member once
// across syncs, and reuses the member maps of the Ruleset written before the
// last one, which the Reconciler no longer holds.
type MemberSets[M interface {
	comparable
	String() string
}] struct {
	names       map[M]string
	last, spare map[string]map[string]struct{} // by set name
}

// Fill adds the sets defs to rs (an entry without a Name is skipped), each
// with the members m for which set(m) is its index in defs.
func (b *MemberSets[M]) Fill(rs *Ruleset, defs []SetDef, members map[M]struct{}, set func(M) int) {
	if len(b.names) > 2*len(members)+1024 {
		b.names = nil // forget the members long gone
	}
	if b.names == nil {
		b.names = make(map[M]string, len(members))
	}
	sets := make([]map[string]struct{}, len(defs))
	for i, d := range defs {
		if d.Name == "" {
			continue
		}
		ms := b.spare[d.Name]
		if ms == nil {
			ms = make(map[string]struct{}, len(b.last[d.Name]))
		}
		sets[i] = ms
		rs.Sets[d.Name] = d.With(ms)
	}
	b.spare = nil
	for m := range members {
		i := set(m)
		if i < 0 || i >= len(sets) || sets[i] == nil {
			continue
		}
		s, ok := b.names[m]
		if !ok {
			s = m.String()
			b.names[m] = s
		}
		sets[i][s] = struct{}{}
	}
}

// Written notes that rs, the last one filled, was written: the member
// maps of the one before it are free for the next Fill (unless sized for
// far more than now: a map never shrinks). Written(nil), after a failed
// sync, reuses nothing.
func (b *MemberSets[M]) Written(rs *Ruleset) {
	old := b.last
	b.last, b.spare = map[string]map[string]struct{}{}, map[string]map[string]struct{}{}
	if rs == nil {
		return
	}
	for name, s := range rs.Sets {
		b.last[name] = s.Members
	}
	for name, o := range old {
		if n, ok := b.last[name]; ok && len(o) <= 2*len(n)+1024 {
			clear(o)
			b.spare[name] = o
		}
	}
}
