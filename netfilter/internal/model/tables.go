package model

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Tables and the chains the kernel builds in, in iptables-save order.
var builtinChains = map[string][]string{
	"nat":    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"filter": {"INPUT", "FORWARD", "OUTPUT"},
	"mangle": {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
	"raw":    {"PREROUTING", "OUTPUT"},
}

// modelledTargets are the targets whose every option the parser knows.
var modelledTargets = map[string]bool{
	"ACCEPT": true, "DROP": true, "RETURN": true, "REJECT": true, "REDIRECT": true,
	"DNAT": true, "MASQUERADE": true, "MARK": true,
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
func (t *table) save(b *strings.Builder) { t.saveChains(b, nil) }

// saveChains writes the chains in only (nil: every chain) in
// iptables-save format.
func (t *table) saveChains(b *strings.Builder, only []string) {
	fmt.Fprintf(b, "*%s\n", t.name)
	names := t.chainNames()
	if only != nil {
		names = slices.DeleteFunc(names, func(n string) bool { return !slices.Contains(only, n) })
	}
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
			if !env.lenient {
				if err := checkHooks(cur); err != nil {
					return fail("%v", err)
				}
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
	r, err := parseRule(spec, env.family)
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

// hookTargets are the targets the kernel allows only from some hooks, with
// those hooks: a rule using one must not be reachable (through jumps) from
// any other builtin chain.
var hookTargets = map[string][]string{
	"DNAT":       {"PREROUTING", "OUTPUT"},
	"REDIRECT":   {"PREROUTING", "OUTPUT"},
	"MASQUERADE": {"POSTROUTING"},
	"SNAT":       {"POSTROUTING", "INPUT"},
	"REJECT":     {"INPUT", "FORWARD", "OUTPUT"},
}

// checkHooks refuses a table in which a hook-restricted target is reachable
// from a builtin chain it may not be used from, as the kernel does when the
// table is committed.
func checkHooks(t *table) error {
	// reach[c] is the set of builtin chains from which c is reachable.
	reach := map[string][]string{}
	var visit func(c, hook string, depth int)
	visit = func(c, hook string, depth int) {
		if depth > 64 || slices.Contains(reach[c], hook) {
			return
		}
		reach[c] = append(reach[c], hook)
		for _, r := range t.chains[c].rules {
			if sub := t.chains[r.target]; sub != nil && !sub.builtin {
				visit(r.target, hook, depth+1)
			}
		}
	}
	for _, b := range builtinChains[t.name] {
		if t.chains[b] != nil {
			visit(b, b, 0)
		}
	}
	for _, name := range t.chainNames() {
		c := t.chains[name]
		if c == nil {
			continue
		}
		for _, r := range c.rules {
			allowed, ok := hookTargets[r.target]
			if !ok || r.opaque {
				continue
			}
			for _, h := range reach[name] {
				if !slices.Contains(allowed, h) {
					return fmt.Errorf("%s target used from hook %s (via chain %s), but only usable from %s", r.target, h, name, strings.Join(allowed, "/"))
				}
			}
		}
	}
	return nil
}

// checkRule refuses what the kernel or iptables would refuse.
func checkRule(t *table, r *rule, env restoreEnv) error {
	switch {
	case r.target == "":
	case r.isGoto && builtinTargets[r.target]:
		return fmt.Errorf("goto '%s' is not a chain", r.target)
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
		if r.target != "REDIRECT" && r.target != "MASQUERADE" {
			return errors.New("--to-ports needs -j REDIRECT or -j MASQUERADE")
		}
		if r.proto == "" {
			return errors.New("--to-ports needs -p tcp or -p udp")
		}
		if n, err := strconv.ParseUint(r.toPorts, 10, 16); err != nil || n == 0 {
			return fmt.Errorf("bad --to-ports %q", r.toPorts)
		}
	}
	switch r.target {
	case "DNAT":
		if t.name != "nat" {
			return errors.New("DNAT is only valid in the nat table")
		}
		if r.toDest == "" {
			return errors.New("DNAT needs --to-destination")
		}
		if _, port, err := parseNATDest(r.toDest, env.family); err != nil {
			return err
		} else if port != 0 && r.proto == "" {
			return errors.New("Need TCP, UDP, SCTP or DCCP with port specification")
		}
	case "MASQUERADE":
		if t.name != "nat" {
			return errors.New("MASQUERADE is only valid in the nat table")
		}
	}
	if r.toDest != "" && r.target != "DNAT" {
		return errors.New("--to-destination needs -j DNAT")
	}
	if r.randomFully && r.target != "MASQUERADE" {
		return errors.New("--random-fully needs -j MASQUERADE")
	}
	if r.hasXmark && r.target != "MARK" {
		return errors.New("--set-xmark needs -j MARK")
	}
	if len(r.targetExtras) > 0 && modelledTargets[r.target] {
		return fmt.Errorf("unknown option %q for target %s", r.targetExtras[0], r.target)
	}
	if r.dst.IsValid() && r.dst.Addr().Is4() != (env.family == IPv4) {
		return fmt.Errorf("-d %v is not an %v address", r.dst, env.family)
	}
	if r.src.IsValid() && r.src.Addr().Is4() != (env.family == IPv4) {
		return fmt.Errorf("-s %v is not an %v address", r.src, env.family)
	}
	if rc := r.recent; rc != nil && rc.mask.Is4() != (env.family == IPv4) {
		return fmt.Errorf("recent --mask %v is not an %v mask", rc.mask, env.family)
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
