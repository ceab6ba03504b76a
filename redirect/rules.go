package redirect

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// rule is one iptables rule in the subset of the syntax svcproxy writes,
// parsed from iptables-restore input or iptables-save output. Anything else
// is kept in extra: such a rule round-trips, compares and can be deleted,
// but the tracer never matches it.
type rule struct {
	text       string // the specification as given
	opaque     bool   // text did not parse: kept verbatim, never matches
	proto      string // "tcp", "udp" or "" (any)
	dst        netip.Prefix
	dstNeg     bool
	dport      uint16
	mark       uint32
	markMask   uint32
	hasMark    bool
	markNeg    bool
	addrType   string // --dst-type, e.g. "LOCAL"
	addrNeg    bool
	ctstates   []string
	ctNeg      bool
	sets       []setMatch
	comment    string
	extra      []string // unrecognised tokens, in order
	target     string   // -j: REDIRECT, REJECT, RETURN, ACCEPT, DROP, a chain, or ""
	toPorts    string   // REDIRECT --to-ports
	rejectWith string   // REJECT --reject-with
}

type setMatch struct {
	name  string
	flags string // "dst", "dst,dst", "src,dst", ...
	neg   bool
}

// String renders r as iptables-save does (without "-A CHAIN"): -d, -p, then
// the matches, then -j and its options. Two rules that mean the same render
// the same, so String is also the comparison key.
func (r *rule) String() string {
	if r.opaque {
		return r.text
	}
	var b strings.Builder
	w := func(s ...string) {
		for _, x := range s {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(x)
		}
	}
	neg := func(n bool) {
		if n {
			w("!")
		}
	}
	if r.dst.IsValid() {
		neg(r.dstNeg)
		w("-d", r.dst.String())
	}
	if r.proto != "" {
		w("-p", r.proto)
	}
	if r.dport != 0 {
		w("-m", r.proto, "--dport", strconv.Itoa(int(r.dport)))
	}
	if r.hasMark {
		w("-m", "mark")
		neg(r.markNeg)
		if r.markMask == ^uint32(0) {
			w("--mark", fmt.Sprintf("%#x", r.mark))
		} else {
			w("--mark", fmt.Sprintf("%#x/%#x", r.mark, r.markMask))
		}
	}
	if r.addrType != "" {
		w("-m", "addrtype")
		neg(r.addrNeg)
		w("--dst-type", r.addrType)
	}
	if len(r.ctstates) > 0 {
		w("-m", "conntrack")
		neg(r.ctNeg)
		w("--ctstate", strings.Join(r.ctstates, ","))
	}
	for _, s := range r.sets {
		w("-m", "set")
		neg(s.neg)
		w("--match-set", s.name, s.flags)
	}
	if r.comment != "" {
		w("-m", "comment", "--comment", strconv.Quote(r.comment))
	}
	w(r.extra...)
	if r.target != "" {
		w("-j", r.target)
	}
	if r.toPorts != "" {
		w("--to-ports", r.toPorts)
	}
	if r.rejectWith != "" {
		w("--reject-with", r.rejectWith)
	}
	return b.String()
}

// tokenize splits a rule the way a shell would for the quoting iptables-save
// uses: double quotes group, a backslash escapes the next character.
func tokenize(s string) ([]string, error) {
	var toks []string
	var cur strings.Builder
	inTok, inQuote := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
			inTok = true
		case c == '"':
			inQuote = !inQuote
			inTok = true
		case !inQuote && (c == ' ' || c == '\t'):
			if inTok {
				toks = append(toks, cur.String())
				cur.Reset()
				inTok = false
			}
		default:
			cur.WriteByte(c)
			inTok = true
		}
	}
	if inQuote {
		return nil, errors.New("unterminated quote")
	}
	if inTok {
		toks = append(toks, cur.String())
	}
	return toks, nil
}

// parseRule parses a rule specification (what follows "-A CHAIN").
func parseRule(spec string) (*rule, error) {
	toks, err := tokenize(spec)
	if err != nil {
		return nil, err
	}
	r := &rule{text: spec}
	neg := false
	arg := func(i int) (string, error) {
		if i+1 >= len(toks) {
			return "", fmt.Errorf("%s needs an argument", toks[i])
		}
		return toks[i+1], nil
	}
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		if t == "!" {
			neg = true
			continue
		}
		takeNeg := func() bool { n := neg; neg = false; return n }
		switch t {
		case "-p", "--protocol":
			v, err := arg(i)
			if err != nil {
				return nil, err
			}
			i++
			if takeNeg() {
				r.extra = append(r.extra, "!", t, v)
				continue
			}
			switch strings.ToLower(v) {
			case "tcp", "6":
				r.proto = "tcp"
			case "udp", "17":
				r.proto = "udp"
			case "all", "0":
			default:
				r.extra = append(r.extra, t, v)
			}
		case "-d", "--destination", "--dst":
			v, err := arg(i)
			if err != nil {
				return nil, err
			}
			i++
			p, err := parsePrefix(v)
			if err != nil {
				return nil, fmt.Errorf("-d %s: %w", v, err)
			}
			r.dst, r.dstNeg = p, takeNeg()
		case "-m", "--match":
			v, err := arg(i)
			if err != nil {
				return nil, err
			}
			i++
			switch v {
			case "tcp", "udp", "mark", "addrtype", "conntrack", "set", "comment":
				// Options are recognised by name below.
			default:
				r.extra = append(r.extra, t, v)
			}
		case "--dport", "--destination-port":
			v, err := arg(i)
			if err != nil {
				return nil, err
			}
			i++
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil || n == 0 || takeNeg() {
				r.extra = append(r.extra, t, v)
				continue
			}
			r.dport = uint16(n)
		case "--mark":
			v, err := arg(i)
			if err != nil {
				return nil, err
			}
			i++
			val, mask, hasMask := strings.Cut(v, "/")
			m, err1 := strconv.ParseUint(val, 0, 32)
			k := uint64(^uint32(0))
			var err2 error
			if hasMask {
				k, err2 = strconv.ParseUint(mask, 0, 32)
			}
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("--mark %s: not a mark", v)
			}
			r.hasMark, r.mark, r.markMask, r.markNeg = true, uint32(m), uint32(k), takeNeg()
		case "--dst-type":
			v, err := arg(i)
			if err != nil {
				return nil, err
			}
			i++
			r.addrType, r.addrNeg = v, takeNeg()
		case "--ctstate":
			v, err := arg(i)
			if err != nil {
				return nil, err
			}
			i++
			r.ctstates, r.ctNeg = strings.Split(v, ","), takeNeg()
		case "--match-set":
			if i+2 >= len(toks) {
				return nil, errors.New("--match-set needs a set name and flags")
			}
			r.sets = append(r.sets, setMatch{name: toks[i+1], flags: toks[i+2], neg: takeNeg()})
			i += 2
		case "--comment":
			v, err := arg(i)
			if err != nil {
				return nil, err
			}
			i++
			r.comment = v
		case "-j", "--jump":
			v, err := arg(i)
			if err != nil {
				return nil, err
			}
			i++
			r.target = v
		case "--to-ports", "--to-port":
			v, err := arg(i)
			if err != nil {
				return nil, err
			}
			i++
			r.toPorts = v
		case "--reject-with":
			v, err := arg(i)
			if err != nil {
				return nil, err
			}
			i++
			r.rejectWith = v
		default:
			if takeNeg() {
				r.extra = append(r.extra, "!")
			}
			r.extra = append(r.extra, t)
		}
	}
	if neg {
		return nil, errors.New("dangling !")
	}
	if r.dport != 0 && r.proto == "" {
		return nil, errors.New("--dport needs -p tcp or -p udp")
	}
	return r, nil
}

// opaqueRule keeps a rule svcproxy cannot parse verbatim, with its target
// if one can be found.
func opaqueRule(spec string) *rule {
	r := &rule{text: spec, opaque: true}
	f := strings.Fields(spec)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "-j" || f[i] == "--jump" {
			r.target = f[i+1]
		}
	}
	return r
}

// parsePrefix parses an address or prefix as iptables does: a bare address
// is a host prefix.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// Tables and the chains the kernel builds in, in iptables-save order.
var builtinChains = map[string][]string{
	"nat":    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"filter": {"INPUT", "FORWARD", "OUTPUT"},
	"mangle": {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
	"raw":    {"PREROUTING", "OUTPUT"},
}

// builtinTargets are the targets that are not chains.
var builtinTargets = map[string]bool{
	"ACCEPT": true, "DROP": true, "RETURN": true, "REJECT": true, "REDIRECT": true,
	"DNAT": true, "SNAT": true, "MASQUERADE": true, "MARK": true, "LOG": true,
	"CONNMARK": true, "NOTRACK": true, "CT": true, "TPROXY": true,
}

type chain struct {
	name    string
	builtin bool
	policy  string // builtin chains: ACCEPT or DROP
	rules   []*rule
}

// table is one table of one family: what iptables-save shows.
type table struct {
	name   string
	chains map[string]*chain
}

func newTable(name string) *table {
	t := &table{name: name, chains: map[string]*chain{}}
	for _, c := range builtinChains[name] {
		t.chains[c] = &chain{name: c, builtin: true, policy: "ACCEPT"}
	}
	return t
}

func (t *table) clone() *table {
	n := &table{name: t.name, chains: make(map[string]*chain, len(t.chains))}
	for k, c := range t.chains {
		cc := *c
		cc.rules = slices.Clone(c.rules)
		n.chains[k] = &cc
	}
	return n
}

// chainNames returns the builtin chains in kernel order, then the others
// sorted.
func (t *table) chainNames() []string {
	names := slices.Clone(builtinChains[t.name])
	var user []string
	for name, c := range t.chains {
		if !c.builtin {
			user = append(user, name)
		}
	}
	slices.Sort(user)
	return append(names, user...)
}

// save renders t as iptables-save does, counters zeroed.
func (t *table) save(b *strings.Builder) {
	fmt.Fprintf(b, "*%s\n", t.name)
	names := t.chainNames()
	for _, name := range names {
		c := t.chains[name]
		if c == nil {
			continue
		}
		pol := "-"
		if c.builtin {
			pol = c.policy
		}
		fmt.Fprintf(b, ":%s %s [0:0]\n", name, pol)
	}
	for _, name := range names {
		c := t.chains[name]
		if c == nil {
			continue
		}
		for _, r := range c.rules {
			fmt.Fprintf(b, "-A %s %s\n", name, r)
		}
	}
	b.WriteString("COMMIT\n")
}

// references reports whether any rule in t jumps to chain name.
func (t *table) references(name string) bool {
	for _, c := range t.chains {
		for _, r := range c.rules {
			if r.target == name {
				return true
			}
		}
	}
	return false
}

// restoreEnv says what a restore may reference beyond the table itself.
type restoreEnv struct {
	family Family
	// setExists reports whether an ipset exists; nil accepts any name.
	setExists func(name string) bool
	// newTable returns a fresh table when input names one the caller does
	// not have yet; nil makes unknown tables an error.
	newTable func(name string) *table
	// lenient reads iptables-save output of a live node: rules that do not
	// parse are kept verbatim, and targets and sets are not checked.
	lenient bool
}

// restore applies iptables-restore --noflush input to tables (keyed by
// name), one table transaction at a time, as the kernel tools do: each
// *table ... COMMIT section applies whole or not at all, and the first
// error stops the input (sections before it stay applied).
func restore(tables map[string]*table, data []byte, env restoreEnv) error {
	var cur *table
	var curName string
	lineNo := 0
	for line := range strings.Lines(string(data)) {
		lineNo++
		line = strings.TrimSpace(line)
		fail := func(format string, args ...any) error {
			return fmt.Errorf("line %d (%q): %s", lineNo, line, fmt.Sprintf(format, args...))
		}
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
			continue
		case strings.HasPrefix(line, "*"):
			if cur != nil {
				return fail("table %s not committed", curName)
			}
			curName = line[1:]
			t := tables[curName]
			if t == nil {
				if env.newTable == nil {
					return fail("table %q does not exist", curName)
				}
				t = env.newTable(curName)
				tables[curName] = t
			}
			cur = t.clone()
			continue
		case line == "COMMIT":
			if cur == nil {
				return fail("COMMIT outside a table")
			}
			tables[curName] = cur
			cur = nil
			continue
		}
		if cur == nil {
			return fail("not in a table")
		}
		if strings.HasPrefix(line, ":") {
			f := strings.Fields(line[1:])
			if len(f) < 2 {
				return fail("bad chain line")
			}
			name, policy := f[0], f[1]
			c := cur.chains[name]
			switch {
			case c != nil && c.builtin:
				if policy != "-" {
					if policy != "ACCEPT" && policy != "DROP" {
						return fail("bad policy %q", policy)
					}
					c.policy = policy
				}
			case c != nil: // --noflush: a declared user chain is flushed
				c.rules = nil
			default:
				if policy != "-" {
					return fail("user chain %s cannot have a policy", name)
				}
				if err := checkChainName(name); err != nil {
					return fail("%v", err)
				}
				cur.chains[name] = &chain{name: name}
			}
			continue
		}
		if err := applyCommand(cur, line, env); err != nil {
			return fail("%v", err)
		}
	}
	if cur != nil {
		return fmt.Errorf("table %s not committed", curName)
	}
	return nil
}

func checkChainName(name string) error {
	if name == "" || len(name) > 28 || strings.HasPrefix(name, "-") || strings.ContainsAny(name, " !") {
		return fmt.Errorf("invalid chain name %q", name)
	}
	return nil
}

// applyCommand applies one -A/-I/-D/-F/-X/-N line to t.
func applyCommand(t *table, line string, env restoreEnv) error {
	cmd, rest, _ := strings.Cut(line, " ")
	name, spec, _ := strings.Cut(strings.TrimSpace(rest), " ")
	spec = strings.TrimSpace(spec)
	c := t.chains[name]
	switch cmd {
	case "-N", "--new-chain":
		if c != nil {
			return fmt.Errorf("chain %s already exists", name)
		}
		if err := checkChainName(name); err != nil {
			return err
		}
		t.chains[name] = &chain{name: name}
		return nil
	case "-X", "--delete-chain":
		switch {
		case c == nil:
			return fmt.Errorf("chain %s does not exist", name)
		case c.builtin:
			return fmt.Errorf("cannot delete builtin chain %s", name)
		case len(c.rules) > 0:
			return fmt.Errorf("chain %s is not empty", name)
		case t.references(name):
			return fmt.Errorf("chain %s is still referenced", name)
		}
		delete(t.chains, name)
		return nil
	}
	if c == nil {
		return fmt.Errorf("chain %q does not exist", name)
	}
	switch cmd {
	case "-F", "--flush":
		c.rules = nil
		return nil
	case "-A", "--append", "-I", "--insert", "-D", "--delete":
	default:
		return fmt.Errorf("unsupported command %q", cmd)
	}
	pos := -1
	if cmd == "-I" || cmd == "--insert" {
		pos = 0
		if n, after, ok := strings.Cut(spec, " "); ok || n != "" {
			if k, err := strconv.Atoi(n); err == nil {
				if k < 1 || k > len(c.rules)+1 {
					return fmt.Errorf("index %d out of range", k)
				}
				pos, spec = k-1, strings.TrimSpace(after)
			}
		}
	}
	if cmd == "-D" || cmd == "--delete" {
		if k, err := strconv.Atoi(spec); err == nil {
			if k < 1 || k > len(c.rules) {
				return fmt.Errorf("index %d out of range", k)
			}
			c.rules = slices.Delete(c.rules, k-1, k)
			return nil
		}
	}
	r, err := parseRule(spec)
	if err != nil && env.lenient {
		r, err = opaqueRule(spec), nil
	}
	if err != nil {
		return err
	}
	if cmd == "-D" || cmd == "--delete" {
		key := r.String()
		for i, x := range c.rules {
			if x.String() == key {
				c.rules = slices.Delete(c.rules, i, i+1)
				return nil
			}
		}
		return errors.New("bad rule (does a matching rule exist in that chain?)")
	}
	if !env.lenient {
		if err := checkRule(t, r, env); err != nil {
			return err
		}
	}
	if pos < 0 {
		c.rules = append(c.rules, r)
	} else {
		c.rules = slices.Insert(c.rules, pos, r)
	}
	return nil
}

// checkRule refuses what the kernel or iptables would refuse.
func checkRule(t *table, r *rule, env restoreEnv) error {
	switch {
	case r.target == "":
	case builtinTargets[r.target]:
	case t.chains[r.target] != nil:
		if t.chains[r.target].builtin {
			return fmt.Errorf("cannot jump to builtin chain %s", r.target)
		}
	default:
		return fmt.Errorf("chain/target %s does not exist", r.target)
	}
	if r.target == "REDIRECT" && t.name != "nat" {
		return errors.New("REDIRECT is only valid in the nat table")
	}
	if r.target == "REJECT" && t.name == "nat" {
		return errors.New("REJECT is not valid in the nat table")
	}
	if r.rejectWith == "tcp-reset" && r.proto != "tcp" {
		return errors.New("--reject-with tcp-reset needs -p tcp")
	}
	if r.toPorts != "" {
		if r.target != "REDIRECT" {
			return errors.New("--to-ports needs -j REDIRECT")
		}
		if n, err := strconv.ParseUint(r.toPorts, 10, 16); err != nil || n == 0 {
			return fmt.Errorf("bad --to-ports %q", r.toPorts)
		}
	}
	if r.dst.IsValid() && r.dst.Addr().Is4() != (env.family == IPv4) {
		return fmt.Errorf("-d %v is not an %v address", r.dst, env.family)
	}
	for _, s := range r.sets {
		if env.setExists != nil && !env.setExists(s.name) {
			return fmt.Errorf("set %s doesn't exist", s.name)
		}
		for _, f := range strings.Split(s.flags, ",") {
			if f != "src" && f != "dst" {
				return fmt.Errorf("bad --match-set flags %q", s.flags)
			}
		}
	}
	return nil
}
