package model

// CanonicalRule returns spec (a rule of family, without "-A CHAIN") the way
// iptables-save prints it, for the matches and targets the model knows.
func CanonicalRule(family Family, spec string) (string, error) {
	r, err := parseRule(spec, family)
	if err != nil {
		return "", err
	}
	return r.String(), nil
}

// CanonicalMembers returns the members m stands for in a set of type typ
// (one of the Set* types; bitmap:port with the range 0-65535) and family
// (ipset's name for it: "inet" or "inet6"), as `ipset save` prints them.
func CanonicalMembers(typ, family, m string) ([]string, error) {
	s := &ipset{typ: typ, family: family, lo: 0, hi: 65535}
	return s.canon(m)
}

// SavedChain is one chain of a table read from iptables-save output.
type SavedChain struct {
	Name  string
	Rules []SavedRule
}

// SavedRule is one rule of a SavedChain.
type SavedRule struct{ r *rule }

// Spec is the rule as iptables-save printed it (without "-A CHAIN").
func (s SavedRule) Spec() string { return s.r.text }

// Target is the rule's -j target, "" when it has none.
func (s SavedRule) Target() string { return s.r.target }

// Canonical is the rule in canonical form (its text when it does not
// parse).
func (s SavedRule) Canonical() string { return s.r.String() }

// ReadTable parses iptables-save output of family and returns the chains of
// tableName in it, builtin chains first in kernel order, then the others
// sorted. Rules it cannot parse are kept verbatim, as a live node may hold
// anything. A table missing from the output has no chains.
func ReadTable(family Family, save []byte, tableName string) ([]SavedChain, error) {
	tables := map[string]*table{}
	if err := restore(tables, save, restoreEnv{family: family, newTable: newTable, lenient: true}); err != nil {
		return nil, err
	}
	t := tables[tableName]
	if t == nil {
		return nil, nil
	}
	names := t.chainNames()
	out := make([]SavedChain, 0, len(names))
	for _, name := range names {
		c := t.chains[name]
		sc := SavedChain{Name: name, Rules: make([]SavedRule, len(c.rules))}
		for i, r := range c.rules {
			sc.Rules[i] = SavedRule{r}
		}
		out = append(out, sc)
	}
	return out, nil
}
