package netfilter

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/svcproxy/svcproxy/lb"
)

// Owned is what one table of iptables-save output holds of a mode's own
// rules: the chains whose names start with its prefix, and the rules of
// other chains that jump into one of them.
type Owned struct {
	// Chains maps each owned chain to its rules in canonical form (the
	// rule's text when it does not parse).
	Chains map[string][]string
	// Jumps are the rules of other chains whose target is an owned chain.
	Jumps []Jump
}

// Jump is a rule in a chain the mode does not own that jumps into one it does.
type Jump struct {
	Chain  string // the chain holding the rule, e.g. "PREROUTING"
	Spec   string // the rule as iptables-save printed it: what -D takes
	Target string // the owned chain it jumps to
	Plain  bool   // the rule is just "-j Target", without matches
}

// ReadOwned parses iptables-save output of tableName for family and returns the
// chains starting with prefix and the jumps into them. Rules it cannot parse
// are kept verbatim, as a live node may hold anything. A table missing from
// the output (nf_tables creates tables lazily) is empty.
func ReadOwned(family Family, tableName string, save []byte, prefix string) (*Owned, error) {
	tables := map[string]*table{}
	if err := restore(tables, save, restoreEnv{family: family, newTable: newTable, lenient: true}); err != nil {
		return nil, err
	}
	o := &Owned{Chains: map[string][]string{}}
	t := tables[tableName]
	if t == nil {
		return o, nil
	}
	for _, name := range t.chainNames() {
		c := t.chains[name]
		if strings.HasPrefix(name, prefix) {
			rs := make([]string, len(c.rules))
			for i, x := range c.rules {
				rs[i] = x.String()
			}
			o.Chains[name] = rs
			continue
		}
		for _, x := range c.rules {
			if strings.HasPrefix(x.target, prefix) {
				o.Jumps = append(o.Jumps, Jump{Chain: name, Spec: x.text, Target: x.target, Plain: x.String() == "-j "+x.target})
			}
		}
	}
	return o, nil
}

// Canonical returns spec (a rule of family, without "-A CHAIN") the way iptables-save
// prints it, for the matches and targets the Fake models: what a mode writes
// in canonical form reads back unchanged, so a full sync can tell tampering
// from its own rules.
func Canonical(family Family, spec string) (string, error) {
	r, err := parseRule(spec, family)
	if err != nil {
		return "", err
	}
	return r.String(), nil
}

// CanonicalMembers returns the members m stands for in a set of type typ
// (one of the Set* types; bitmap:port with the range 0-65535) and family,
// as `ipset save` prints them.
func CanonicalMembers(typ string, family Family, m string) ([]string, error) {
	s := &ipset{typ: typ, family: inetName(family), lo: 0, hi: 65535}
	return s.canon(m)
}

func protoName(p lb.Protocol) string {
	if p == lb.UDP {
		return "udp"
	}
	return "tcp"
}

func inetName(f Family) string {
	if f == IPv6 {
		return "inet6"
	}
	return "inet"
}

// DestroySet destroys a set, waiting out references the nf_tables backend
// releases asynchronously after their rule is deleted. A set that does not
// exist is not an error.
func DestroySet(ctx context.Context, e Executor, name string) error {
	delay := 20 * time.Millisecond
	for attempt := 0; ; attempt++ {
		err := e.IPSetDestroy(ctx, name)
		if err == nil || errors.Is(err, ErrNoSet) {
			return nil
		}
		if !errors.Is(err, ErrSetInUse) || attempt == 6 {
			return fmt.Errorf("destroying ipset %s: %w", name, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("destroying ipset %s: %w", name, ctx.Err())
		case <-time.After(delay):
			delay *= 2
		}
	}
}
