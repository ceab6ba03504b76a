package netfilter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter/internal/model"
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
	Rule   string // the rule in canonical form
}

// ReadOwned parses iptables-save output of tableName for family and returns the
// chains starting with prefix and the jumps into them. Rules it cannot parse
// are kept verbatim, as a live node may hold anything. A table missing from
// the output (nf_tables creates tables lazily) is empty.
func ReadOwned(family Family, tableName string, save []byte, prefix string) (*Owned, error) {
	chains, err := model.ReadTable(family, save, tableName)
	if err != nil {
		return nil, err
	}
	o := &Owned{Chains: map[string][]string{}}
	for _, c := range chains {
		if strings.HasPrefix(c.Name, prefix) {
			rs := make([]string, len(c.Rules))
			for i, x := range c.Rules {
				rs[i] = x.Canonical()
			}
			o.Chains[c.Name] = rs
			continue
		}
		for _, x := range c.Rules {
			if strings.HasPrefix(x.Target(), prefix) {
				o.Jumps = append(o.Jumps, Jump{Chain: c.Name, Spec: x.Spec(), Target: x.Target(), Rule: x.Canonical()})
			}
		}
	}
	return o, nil
}

// Canonical returns spec (a rule of family, without "-A CHAIN") the way iptables-save
// prints it, for the matches and targets svcproxy writes: what a mode writes
// in canonical form reads back unchanged, so a full sync can tell tampering
// from its own rules.
func Canonical(family Family, spec string) (string, error) {
	return model.CanonicalRule(family, spec)
}

// CanonicalMembers returns the members m stands for in a set of type typ
// (one of the Set* types; bitmap:port with the range 0-65535) and family,
// as `ipset save` prints them.
func CanonicalMembers(typ string, family Family, m string) ([]string, error) {
	return model.CanonicalMembers(typ, InetName(family), m)
}

// ProtoName is p as iptables, ipset and conntrack name it: "tcp", "udp"
// or "sctp".
func ProtoName(p lb.Protocol) string { return model.ProtoName(p) }

// DestroySet destroys a set, waiting out references the nf_tables backend
// releases asynchronously after their rule is deleted. A set that does not
// exist is not an error.
func DestroySet(ctx context.Context, e interface {
	IPSetDestroy(ctx context.Context, name string) error
}, name string) error {
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

// Cleanup removes everything named as a mode's own: in both families, the
// chains of the nat and filter tables whose names start with chainPrefix
// and every rule of other chains jumping into one (one iptables-restore per
// family), then the sets whose names start with setPrefix. Everything else
// stays as it was, also what another process installed under those names.
// IPv6 failures count only when ipv6 is set: a node may have no ip6tables.
func Cleanup(ctx context.Context, e Tools, chainPrefix, setPrefix string, ipv6 bool) error {
	var errs []error
	for _, fam := range []Family{IPv4, IPv6} {
		if err := RemoveOwned(ctx, e, fam, chainPrefix); err != nil && (fam == IPv4 || ipv6) {
			errs = append(errs, err)
		}
	}
	out, err := e.IPSetSave(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("listing ipsets: %w", err))
	}
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "create" && strings.HasPrefix(f[1], setPrefix) {
			if err := DestroySet(ctx, e, f[1]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// OwnedTables are the tables svcproxy's modes write rules into.
var OwnedTables = []string{"nat", "filter"}

// ReadOwnedTables reads each of OwnedTables of family with iptables-save
// and returns, by table name, what ReadOwned finds there for prefix.
func ReadOwnedTables(ctx context.Context, e interface {
	IPTablesSave(ctx context.Context, family Family, table string) ([]byte, error)
}, family Family, prefix string) (map[string]*Owned, error) {
	owned := make(map[string]*Owned, len(OwnedTables))
	for _, tbl := range OwnedTables {
		save, err := e.IPTablesSave(ctx, family, tbl)
		if err != nil {
			return nil, fmt.Errorf("reading %v %s table: %w", family, tbl, err)
		}
		if owned[tbl], err = ReadOwned(family, tbl, save, prefix); err != nil {
			return nil, fmt.Errorf("parsing %v %s table: %w", family, tbl, err)
		}
	}
	return owned, nil
}

// RemoveOwned removes family's chains starting with prefix, and the jumps
// into them, from OwnedTables: Cleanup for one family, sets left alone
// (the other family's rules may use them).
func RemoveOwned(ctx context.Context, e Tools, family Family, prefix string) error {
	owned, err := ReadOwnedTables(ctx, e, family, prefix)
	if err != nil {
		return err
	}
	var b strings.Builder
	for _, tbl := range OwnedTables {
		o := owned[tbl]
		if len(o.Chains)+len(o.Jumps) == 0 {
			continue
		}
		var decl, del, drop []string
		for name := range o.Chains {
			decl = append(decl, ":"+name+" - [0:0]")
			drop = append(drop, "-X "+name)
		}
		for _, j := range o.Jumps {
			del = append(del, "-D "+j.Chain+" "+j.Spec)
		}
		slices.Sort(decl)
		slices.Sort(drop)
		fmt.Fprintf(&b, "*%s\n%s\nCOMMIT\n", tbl, strings.Join(slices.Concat(decl, del, drop), "\n"))
	}
	if b.Len() == 0 {
		return nil
	}
	if err := e.IPTablesRestore(ctx, family, []byte(b.String())); err != nil {
		return fmt.Errorf("removing %v rules: %w", family, err)
	}
	return nil
}
