package ipvs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// FakeRules is an in-memory Rules: it parses exactly what the real tools
// get (iptables-restore with *table, :CHAIN, -A/-I/-D/-N/-F/-X and COMMIT;
// ipset restore with -exist: create/add/del/flush/swap/destroy), refuses
// what they would refuse (a jump to a missing chain, a rule naming a missing
// set, deleting a missing rule, destroying a set in use), keeps the nat and
// filter tables of both families and the sets, and lets Fakes.Trace walk
// them. It is safe for concurrent use.
type FakeRules struct {
	mu      sync.Mutex
	tables  [2]map[string]*fTable
	sets    map[string]*fSet
	version string
	calls   []string
	failing map[string]error
}

// NewFakeRules returns empty nat and filter tables for both families, no
// sets, reporting iptables v1.8.9 (legacy).
func NewFakeRules() *FakeRules {
	f := &FakeRules{sets: map[string]*fSet{}, failing: map[string]error{}, version: "iptables v1.8.9 (legacy)"}
	for fam := range f.tables {
		f.tables[fam] = map[string]*fTable{"nat": newFTable("nat"), "filter": newFTable("filter")}
	}
	return f
}

var _ Rules = (*FakeRules)(nil)

// SetVersion sets what IPTablesVersion reports.
func (f *FakeRules) SetVersion(v string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.version = v
}

// FailNext makes the next call of op ("iptables-restore", "iptables-save",
// "iptables-version", "ipset-restore", "ipset-save", "ipset-destroy") fail
// with err, changing nothing.
func (f *FakeRules) FailNext(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failing[op] = err
}

// Calls returns the calls so far as "op" or "op arg", oldest first.
func (f *FakeRules) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// ResetCalls forgets the calls so far.
func (f *FakeRules) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = nil
}

func (f *FakeRules) record(op, arg string) error {
	f.calls = append(f.calls, strings.TrimSpace(op+" "+arg))
	if err := f.failing[op]; err != nil {
		delete(f.failing, op)
		return fmt.Errorf("fake %s: %w", op, err)
	}
	return nil
}

// IPTablesRestore implements Rules.
func (f *FakeRules) IPTablesRestore(ctx context.Context, family Family, data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("iptables-restore", family.String()); err != nil {
		return err
	}
	return f.restore(family, data)
}

// IPTablesSave implements Rules.
func (f *FakeRules) IPTablesSave(ctx context.Context, family Family, table string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("iptables-save", family.String()+" "+table); err != nil {
		return nil, err
	}
	t := f.tables[family][table]
	if t == nil {
		return nil, fmt.Errorf("table %q does not exist", table)
	}
	var b strings.Builder
	t.save(&b)
	return []byte(b.String()), nil
}

// IPTablesVersion implements Rules.
func (f *FakeRules) IPTablesVersion(ctx context.Context) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("iptables-version", ""); err != nil {
		return "", err
	}
	return f.version, nil
}

// IPSetRestore implements Rules.
func (f *FakeRules) IPSetRestore(ctx context.Context, data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("ipset-restore", ""); err != nil {
		return err
	}
	for i, line := range strings.Split(string(data), "\n") {
		if err := f.ipsetLine(strings.Fields(line)); err != nil {
			return fmt.Errorf("ipset restore line %d %q: %w", i+1, line, err)
		}
	}
	return nil
}

// IPSetSave implements Rules.
func (f *FakeRules) IPSetSave(ctx context.Context) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("ipset-save", ""); err != nil {
		return nil, err
	}
	return []byte(f.dumpSets()), nil
}

// IPSetDestroy implements Rules.
func (f *FakeRules) IPSetDestroy(ctx context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("ipset-destroy", name); err != nil {
		return err
	}
	return f.destroy(name)
}

// Dump renders everything, as iptables-save (IPv4 then IPv6, nat then
// filter) and ipset save would, in a stable order.
func (f *FakeRules) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for fam, tables := range f.tables {
		fmt.Fprintf(&b, "# %v\n", Family(fam))
		tables["nat"].save(&b)
		tables["filter"].save(&b)
	}
	b.WriteString(f.dumpSets())
	return b.String()
}

// SetMembers returns the members of a set, sorted; nil when it does not exist.
func (f *FakeRules) SetMembers(name string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.sets[name]
	if s == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(s.members))
}

// Empty reports whether no svcproxy-ipvs set or SVCPROXY-IPVS chain or
// rule is left, and says what is when one is.
func (f *FakeRules) Empty() (bool, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var left []string
	for name := range f.sets {
		if strings.HasPrefix(name, setPrefix) {
			left = append(left, "set "+name)
		}
	}
	for fam, tables := range f.tables {
		for tn, t := range tables {
			for cn, c := range t.chains {
				if strings.HasPrefix(cn, chainPrefix) {
					left = append(left, fmt.Sprintf("%v %s chain %s", Family(fam), tn, cn))
				}
				for _, r := range c.rules {
					if strings.HasPrefix(r.target, chainPrefix) {
						left = append(left, fmt.Sprintf("%v %s rule -A %s %s", Family(fam), tn, cn, r.spec))
					}
				}
			}
		}
	}
	slices.Sort(left)
	return len(left) == 0, strings.Join(left, "\n")
}

// --- iptables ---

type fTable struct {
	name   string
	chains map[string]*fChain
}

type fChain struct {
	builtin bool
	policy  string
	rules   []*fRule
}

var builtinChains = map[string][]string{
	"nat":    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"filter": {"INPUT", "FORWARD", "OUTPUT"},
}

func newFTable(name string) *fTable {
	t := &fTable{name: name, chains: map[string]*fChain{}}
	for _, c := range builtinChains[name] {
		t.chains[c] = &fChain{builtin: true, policy: "ACCEPT"}
	}
	return t
}

func (t *fTable) clone() *fTable {
	c := &fTable{name: t.name, chains: make(map[string]*fChain, len(t.chains))}
	for n, ch := range t.chains {
		cc := *ch
		cc.rules = slices.Clone(ch.rules)
		c.chains[n] = &cc
	}
	return c
}

func (t *fTable) save(b *strings.Builder) {
	fmt.Fprintf(b, "*%s\n", t.name)
	builtins := builtinChains[t.name]
	for _, n := range builtins {
		fmt.Fprintf(b, ":%s %s [0:0]\n", n, t.chains[n].policy)
	}
	custom := slices.Sorted(maps.Keys(t.chains))
	custom = slices.DeleteFunc(custom, func(n string) bool { return t.chains[n].builtin })
	for _, n := range custom {
		fmt.Fprintf(b, ":%s - [0:0]\n", n)
	}
	for _, n := range slices.Concat(builtins, custom) {
		for _, r := range t.chains[n].rules {
			fmt.Fprintf(b, "-A %s %s\n", n, r.spec)
		}
	}
	b.WriteString("COMMIT\n")
}

// references counts the rules jumping to chain.
func (t *fTable) references(chain string) int {
	n := 0
	for _, c := range t.chains {
		for _, r := range c.rules {
			if r.target == chain {
				n++
			}
		}
	}
	return n
}

// restore applies iptables-restore --noflush input; each table is
// committed at its COMMIT, and an error discards that table's changes.
func (f *FakeRules) restore(family Family, data []byte) error {
	var cur *fTable
	for i, raw := range strings.Split(string(data), "\n") {
		line := strings.TrimSpace(raw)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fail := func(format string, args ...any) error {
			return fmt.Errorf("iptables-restore: line %d failed (%q): %s", i+1, line, fmt.Sprintf(format, args...))
		}
		switch {
		case strings.HasPrefix(line, "*"):
			t := f.tables[family][line[1:]]
			if t == nil {
				return fail("unknown table")
			}
			cur = t.clone()
			continue
		case line == "COMMIT":
			if cur == nil {
				return fail("COMMIT outside a table")
			}
			f.tables[family][cur.name] = cur
			cur = nil
			continue
		case cur == nil:
			return fail("no table")
		case strings.HasPrefix(line, ":"):
			fields := strings.Fields(line[1:])
			name := fields[0]
			if c := cur.chains[name]; c != nil && c.builtin {
				if len(fields) > 1 && fields[1] != "-" {
					c.policy = fields[1]
				}
				continue
			}
			if c := cur.chains[name]; c != nil {
				c.rules = nil // --noflush still flushes declared chains
			} else {
				cur.chains[name] = &fChain{}
			}
			continue
		}
		op, rest, _ := strings.Cut(line, " ")
		chain, spec, _ := strings.Cut(strings.TrimSpace(rest), " ")
		c := cur.chains[chain]
		if c == nil && op != "-N" {
			return fail("chain %s does not exist", chain)
		}
		switch op {
		case "-N":
			if c != nil {
				return fail("chain %s already exists", chain)
			}
			cur.chains[chain] = &fChain{}
		case "-F":
			c.rules = nil
		case "-X":
			if c.builtin {
				return fail("cannot delete builtin chain %s", chain)
			}
			if len(c.rules) > 0 || cur.references(chain) > 0 {
				return fail("chain %s is not empty or still referenced", chain)
			}
			delete(cur.chains, chain)
		case "-A", "-I", "-D":
			pos := 0
			if op == "-I" {
				if n, rest, ok := strings.Cut(spec, " "); ok {
					if p, err := strconv.Atoi(n); err == nil {
						pos, spec = p-1, rest
					}
				}
			}
			r, err := parseFRule(spec)
			if err != nil {
				return fail("%v", err)
			}
			if op == "-D" {
				idx := slices.IndexFunc(c.rules, func(x *fRule) bool { return x.spec == r.spec })
				if idx < 0 {
					return fail("Bad rule (does a matching rule exist in that chain?)")
				}
				c.rules = slices.Delete(c.rules, idx, idx+1)
				continue
			}
			if err := f.validate(cur, r); err != nil {
				return fail("%v", err)
			}
			if op == "-A" {
				c.rules = append(c.rules, r)
			} else {
				c.rules = slices.Insert(c.rules, min(max(pos, 0), len(c.rules)), r)
			}
		default:
			return fail("unknown command %s", op)
		}
	}
	if cur != nil {
		return errors.New("iptables-restore: missing COMMIT")
	}
	return nil
}

var standardTargets = []string{"ACCEPT", "DROP", "RETURN", "REJECT", "MARK", "MASQUERADE", "LOG", "DNAT", "SNAT", "REDIRECT"}

func (f *FakeRules) validate(t *fTable, r *fRule) error {
	if r.target != "" && !slices.Contains(standardTargets, r.target) {
		c := t.chains[r.target]
		if c == nil || c.builtin {
			return fmt.Errorf("Couldn't load target `%s'", r.target)
		}
	}
	for _, m := range r.sets {
		if f.sets[m.name] == nil {
			return fmt.Errorf("Set %s doesn't exist", m.name)
		}
	}
	return nil
}

// fRule is one rule in the subset of the syntax svcproxy writes. Anything
// else makes it opaque: it round-trips but never matches.
type fRule struct {
	spec     string // the specification, whitespace normalised
	opaque   bool
	proto    string
	src, dst netip.Prefix
	srcNeg   bool
	dstNeg   bool
	dport    uint16
	sets     []fSetMatch
	hasMark  bool
	mark     uint32
	markMask uint32
	markNeg  bool
	ctstates []string
	ctNeg    bool
	addrType string
	addrNeg  bool

	target     string
	rejectWith string
	markOp     string // "or", "xor", "set" (set-xmark value/mask)
	markVal    uint32
	markOpMask uint32
}

type fSetMatch struct {
	name  string
	flags []string
	neg   bool
}

func parseFRule(spec string) (*fRule, error) {
	toks := strings.Fields(spec)
	r := &fRule{spec: strings.Join(toks, " ")}
	neg := false
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		if t == "!" {
			neg = true
			continue
		}
		arg := func() (string, error) {
			if i+1 >= len(toks) {
				return "", fmt.Errorf("%s needs an argument", t)
			}
			i++
			return toks[i], nil
		}
		n := neg
		neg = false
		switch t {
		case "-p", "--protocol":
			v, err := arg()
			if err != nil {
				return nil, err
			}
			switch v {
			case "tcp", "udp", "sctp":
				r.proto = v
			case "all":
			default:
				r.opaque = true
			}
			if n {
				r.opaque = true
			}
		case "-s", "--source", "-d", "--destination":
			v, err := arg()
			if err != nil {
				return nil, err
			}
			p, err := parsePrefixOrAddr(v)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", t, v, err)
			}
			if t == "-s" || t == "--source" {
				r.src, r.srcNeg = p, n
			} else {
				r.dst, r.dstNeg = p, n
			}
		case "-m", "--match":
			v, err := arg()
			if err != nil {
				return nil, err
			}
			switch v {
			case "set", "mark", "conntrack", "addrtype", "comment", "tcp", "udp", "sctp":
			default:
				r.opaque = true
			}
		case "--match-set":
			name, err := arg()
			if err != nil {
				return nil, err
			}
			flags, err := arg()
			if err != nil {
				return nil, err
			}
			r.sets = append(r.sets, fSetMatch{name: name, flags: strings.Split(flags, ","), neg: n})
		case "--mark":
			v, err := arg()
			if err != nil {
				return nil, err
			}
			val, mask, err := parseMark(v)
			if err != nil {
				return nil, err
			}
			r.hasMark, r.mark, r.markMask, r.markNeg = true, val, mask, n
		case "--ctstate":
			v, err := arg()
			if err != nil {
				return nil, err
			}
			r.ctstates, r.ctNeg = strings.Split(v, ","), n
		case "--dst-type":
			v, err := arg()
			if err != nil {
				return nil, err
			}
			r.addrType, r.addrNeg = v, n
		case "--dport", "--destination-port":
			v, err := arg()
			if err != nil {
				return nil, err
			}
			p, err := strconv.ParseUint(v, 10, 16)
			if err != nil || n {
				r.opaque = true
			}
			r.dport = uint16(p)
		case "--comment":
			if _, err := arg(); err != nil {
				return nil, err
			}
		case "-j", "--jump", "-g", "--goto":
			v, err := arg()
			if err != nil {
				return nil, err
			}
			r.target = v
		case "--reject-with":
			v, err := arg()
			if err != nil {
				return nil, err
			}
			r.rejectWith = v
		case "--or-mark", "--xor-mark", "--set-xmark", "--set-mark":
			v, err := arg()
			if err != nil {
				return nil, err
			}
			val, mask, err := parseMark(v)
			if err != nil {
				return nil, err
			}
			switch t {
			case "--or-mark":
				r.markOp, r.markVal, r.markOpMask = "set", val, val
			case "--xor-mark":
				r.markOp, r.markVal, r.markOpMask = "set", val, 0
			default:
				r.markOp, r.markVal, r.markOpMask = "set", val, mask
			}
		case "--random-fully", "--random", "--to-ports", "--to-destination", "--to-source":
			if t != "--random-fully" && t != "--random" {
				if _, err := arg(); err != nil {
					return nil, err
				}
			}
		default:
			r.opaque = true
		}
	}
	return r, nil
}

func parseMark(v string) (val, mask uint32, err error) {
	a, b, hasMask := strings.Cut(v, "/")
	x, err := strconv.ParseUint(a, 0, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("bad mark %q", v)
	}
	m := uint64(^uint32(0))
	if hasMask {
		if m, err = strconv.ParseUint(b, 0, 32); err != nil {
			return 0, 0, fmt.Errorf("bad mark %q", v)
		}
	}
	return uint32(x), uint32(m), nil
}

func parsePrefixOrAddr(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// --- ipset ---

type fSet struct {
	typ     string
	family  string // inet, inet6
	members map[string]struct{}
}

func (f *FakeRules) ipsetLine(fields []string) error {
	if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
		return nil
	}
	if len(fields) < 2 {
		return errors.New("missing set name")
	}
	cmd, name := fields[0], fields[1]
	s := f.sets[name]
	need := func() error {
		if s == nil {
			return fmt.Errorf("The set with the given name does not exist: %w", ErrNoSet)
		}
		return nil
	}
	switch cmd {
	case "create":
		if len(fields) < 3 {
			return errors.New("create needs a type")
		}
		typ := fields[2]
		switch typ {
		case typeIP, typeIPPort, typeIPPortIP, typePort, "hash:net":
		default:
			return fmt.Errorf("unknown set type %s", typ)
		}
		family := "inet"
		for i := 3; i+1 < len(fields); i++ {
			if fields[i] == "family" {
				family = fields[i+1]
			}
		}
		if s != nil {
			if s.typ != typ || (typ != typePort && s.family != family) {
				return errors.New("Set cannot be created: set with the same name already exists")
			}
			return nil
		}
		f.sets[name] = &fSet{typ: typ, family: family, members: map[string]struct{}{}}
	case "add", "del":
		if err := need(); err != nil {
			return err
		}
		if len(fields) < 3 {
			return errors.New("missing member")
		}
		m, err := s.canon(fields[2])
		if err != nil {
			return err
		}
		if cmd == "add" {
			s.members[m] = struct{}{}
		} else {
			delete(s.members, m)
		}
	case "flush":
		if err := need(); err != nil {
			return err
		}
		clear(s.members)
	case "swap":
		if err := need(); err != nil {
			return err
		}
		if len(fields) < 3 || f.sets[fields[2]] == nil {
			return fmt.Errorf("swap: %w", ErrNoSet)
		}
		o := f.sets[fields[2]]
		if o.typ != s.typ || o.family != s.family {
			return errors.New("The sets cannot be swapped: their type does not match")
		}
		s.members, o.members = o.members, s.members
	case "destroy":
		return f.destroy(name)
	default:
		return fmt.Errorf("unknown command %s", cmd)
	}
	return nil
}

func (f *FakeRules) destroy(name string) error {
	if f.sets[name] == nil {
		return fmt.Errorf("destroying %s: %w", name, ErrNoSet)
	}
	for _, tables := range f.tables {
		for _, t := range tables {
			for _, c := range t.chains {
				for _, r := range c.rules {
					for _, m := range r.sets {
						if m.name == name {
							return fmt.Errorf("destroying %s: Set cannot be destroyed: it is in use by a kernel component: %w", name, ErrSetInUse)
						}
					}
				}
			}
		}
	}
	delete(f.sets, name)
	return nil
}

// canon validates a member for s and returns it as ipset save prints it.
func (s *fSet) canon(m string) (string, error) {
	addr := func(x string) (netip.Addr, error) {
		a, err := netip.ParseAddr(x)
		if err != nil {
			return a, err
		}
		if (s.family == "inet6") != a.Is6() {
			return a, fmt.Errorf("address %v is of the wrong family for a %s set", a, s.family)
		}
		return a, nil
	}
	protoPort := func(x string) (string, error) {
		proto, port, ok := strings.Cut(x, ":")
		if !ok {
			proto, port = "tcp", x
		}
		if name, ok := map[string]string{"6": "tcp", "17": "udp", "132": "sctp"}[proto]; ok {
			proto = name // ipset takes numbers too and prints names
		}
		if proto != "tcp" && proto != "udp" && proto != "sctp" {
			return "", fmt.Errorf("unknown protocol %q", proto)
		}
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return "", fmt.Errorf("bad port %q", port)
		}
		return proto + ":" + strconv.Itoa(int(p)), nil
	}
	parts := strings.Split(m, ",")
	switch s.typ {
	case typePort:
		p, err := strconv.ParseUint(m, 10, 16)
		if err != nil {
			return "", fmt.Errorf("bad port %q", m)
		}
		return strconv.Itoa(int(p)), nil
	case typeIP:
		a, err := addr(m)
		return a.String(), err
	case "hash:net":
		p, err := parsePrefixOrAddr(m)
		return p.String(), err
	case typeIPPort, typeIPPortIP:
		want := 2
		if s.typ == typeIPPortIP {
			want = 3
		}
		if len(parts) != want {
			return "", fmt.Errorf("bad %s member %q", s.typ, m)
		}
		a, err := addr(parts[0])
		if err != nil {
			return "", err
		}
		pp, err := protoPort(parts[1])
		if err != nil {
			return "", err
		}
		out := a.String() + "," + pp
		if want == 3 {
			b, err := addr(parts[2])
			if err != nil {
				return "", err
			}
			out += "," + b.String()
		}
		return out, nil
	}
	return "", fmt.Errorf("unknown set type %s", s.typ)
}

func (f *FakeRules) dumpSets() string {
	var b strings.Builder
	for _, n := range slices.Sorted(maps.Keys(f.sets)) {
		s := f.sets[n]
		if s.typ == typePort {
			fmt.Fprintf(&b, "create %s %s range 0-65535\n", n, s.typ)
		} else {
			fmt.Fprintf(&b, "create %s %s family %s hashsize 1024 maxelem 65536\n", n, s.typ, s.family)
		}
		for _, m := range slices.Sorted(maps.Keys(s.members)) {
			fmt.Fprintf(&b, "add %s %s\n", n, m)
		}
	}
	return b.String()
}

// setHas is xt_set's test for packet fields picked by flags.
func (f *FakeRules) setHas(m fSetMatch, p *tracedPacket) bool {
	s := f.sets[m.name]
	if s == nil {
		return false
	}
	pick := func(i int) netip.AddrPort {
		if i < len(m.flags) && m.flags[i] == "src" {
			return p.src
		}
		return p.dst
	}
	fam := "inet"
	if p.dst.Addr().Is6() {
		fam = "inet6"
	}
	if s.typ != typePort && s.family != fam {
		return false
	}
	pp := func(i int) string { return p.proto + ":" + strconv.Itoa(int(pick(i).Port())) }
	var key string
	switch s.typ {
	case typePort:
		if p.proto != "tcp" && p.proto != "udp" {
			return false // the kernel's bitmap:port reads TCP and UDP ports only
		}
		key = strconv.Itoa(int(pick(0).Port()))
	case typeIP:
		key = pick(0).Addr().String()
	case typeIPPort:
		key = pick(0).Addr().String() + "," + pp(1)
	case typeIPPortIP:
		key = pick(0).Addr().String() + "," + pp(1) + "," + pick(2).Addr().String()
	case "hash:net":
		for mem := range s.members {
			if pfx, err := netip.ParsePrefix(mem); err == nil && pfx.Contains(pick(0).Addr()) {
				return true
			}
		}
		return false
	}
	_, ok := s.members[key]
	return ok
}

// verdict is the outcome of walking a chain.
type verdict uint8

const (
	vContinue verdict = iota // fell off the end or RETURNed
	vAccept
	vDrop
	vReject
	vMasquerade
)

// walk evaluates chain name of table for p. rule receives the deciding
// rule's text.
func (f *FakeRules) walk(family Family, table, name string, p *tracedPacket, rule *string, depth int) verdict {
	t := f.tables[family][table]
	c := t.chains[name]
	if c == nil || depth > 32 {
		return vContinue
	}
	for _, r := range c.rules {
		if !f.matches(r, p) {
			continue
		}
		text := "-A " + name + " " + r.spec
		switch r.target {
		case "RETURN":
			return vContinue
		case "ACCEPT":
			*rule = text
			return vAccept
		case "DROP":
			*rule = text
			return vDrop
		case "REJECT":
			*rule = text
			return vReject
		case "MASQUERADE":
			*rule = text
			return vMasquerade
		case "MARK":
			p.mark = (p.mark &^ r.markOpMask) ^ r.markVal
			continue
		}
		if sub := t.chains[r.target]; sub != nil && !sub.builtin {
			if v := f.walk(family, table, r.target, p, rule, depth+1); v != vContinue {
				return v
			}
		}
	}
	if c.builtin && c.policy == "DROP" {
		*rule = ":" + name + " DROP"
		return vDrop
	}
	return vContinue
}

func (f *FakeRules) matches(r *fRule, p *tracedPacket) bool {
	if r.opaque {
		return false
	}
	if r.proto != "" && r.proto != p.proto {
		return false
	}
	if r.src.IsValid() && r.src.Contains(p.src.Addr()) == r.srcNeg {
		return false
	}
	if r.dst.IsValid() && r.dst.Contains(p.dst.Addr()) == r.dstNeg {
		return false
	}
	if r.dport != 0 && r.dport != p.dst.Port() {
		return false
	}
	if r.hasMark && (p.mark&r.markMask == r.mark) == r.markNeg {
		return false
	}
	if r.addrType != "" && (r.addrType != "LOCAL" || p.isLocal(p.dst.Addr()) == r.addrNeg) {
		return false
	}
	if len(r.ctstates) > 0 && slices.Contains(r.ctstates, "NEW") == r.ctNeg {
		return false // a traced packet is the first of its connection
	}
	for _, m := range r.sets {
		if f.setHas(m, p) == m.neg {
			return false
		}
	}
	return true
}
