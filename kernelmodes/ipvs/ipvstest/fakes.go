package ipvstest

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
)

// Fakes is an in-memory kernel: one fake per boundary of the IPVS mode, and
// a packet tracer over them all (Trace, Connect). Plug it in with Config.
type Fakes struct {
	IPVS      *IPVS
	Links     *Links
	Rules     *netfiltertest.Fake
	Conntrack *Conntrack
	Sysctls   *Sysctls
}

var _ ipvs.Rules = (*netfiltertest.Fake)(nil)

// NewFakes returns an empty kernel (loopback only) on clock now (nil:
// time.Now).
func NewFakes(now func() time.Time) *Fakes {
	return &Fakes{
		IPVS:      NewIPVS(now),
		Links:     NewLinks(),
		Rules:     netfiltertest.NewFake(),
		Conntrack: &Conntrack{},
		Sysctls:   NewSysctls(),
	}
}

// Config returns cfg with the fakes as every kernel boundary cfg leaves nil
// (so a test can mix a real boundary with fakes).
func (f *Fakes) Config(cfg ipvs.Config) ipvs.Config {
	if cfg.IPVS == nil {
		cfg.IPVS = f.IPVS
	}
	if cfg.Links == nil {
		cfg.Links = f.Links
	}
	if cfg.Rules == nil {
		cfg.Rules = f.Rules
	}
	if cfg.Conntrack == nil {
		cfg.Conntrack = f.Conntrack
	}
	if cfg.Sysctls == nil {
		cfg.Sysctls = f.Sysctls
	}
	return cfg
}

// Calls returns every call any fake received since the last ResetCalls;
// the Rules' as "op", "op family" or "op family table" (iptables) and
// "op set" (ipset-destroy, ipset-list).
func (f *Fakes) Calls() []string {
	var rules []string
	for _, c := range f.Rules.Calls() {
		s := c.Op
		switch c.Op {
		case "iptables-restore":
			s += " " + c.Family.String()
		case "iptables-save", "iptables-save-chains":
			s += " " + c.Family.String() + " " + c.Data
		case "ipset-destroy", "ipset-list":
			s += " " + c.Data
		}
		rules = append(rules, s)
	}
	return slices.Concat(f.IPVS.Calls(), f.Links.Calls(), rules, f.Conntrack.Calls(), f.Sysctls.Calls())
}

// ResetCalls forgets every fake's calls.
func (f *Fakes) ResetCalls() {
	f.IPVS.ResetCalls()
	f.Links.ResetCalls()
	f.Rules.ResetCalls()
	f.Conntrack.ResetCalls()
	f.Sysctls.ResetCalls()
}

// RulesLeft lists what is left in the Rules of the IPVS mode's: its
// svcproxy-ipvs-* sets, its SVCPROXY-IPVS-* chains and every rule jumping
// to one. None is left after a Cleanup.
func (f *Fakes) RulesLeft() []string {
	var left []string
	where := ""
	for line := range strings.Lines(f.Rules.Dump()) {
		line = strings.TrimSpace(line)
		fields := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "# "):
			where = line[2:] // the family
		case strings.HasPrefix(line, "*"):
			where = strings.Fields(where)[0] + " " + line[1:]
		case strings.HasPrefix(line, ":SVCPROXY-IPVS-"):
			left = append(left, fmt.Sprintf("%s chain %s", where, fields[0][1:]))
		case strings.HasPrefix(line, "-A ") && strings.HasPrefix(target(fields), "SVCPROXY-IPVS-"):
			left = append(left, fmt.Sprintf("%s rule %s", where, line))
		case strings.HasPrefix(line, "create svcproxy-ipvs-"):
			left = append(left, "set "+fields[1])
		}
	}
	slices.Sort(left)
	return left
}

// target returns the -j or -g target of a rule's fields.
func target(fields []string) string {
	for i := 0; i+1 < len(fields); i++ {
		if fields[i] == "-j" || fields[i] == "-g" {
			return fields[i+1]
		}
	}
	return ""
}

// recorder logs the calls a fake receives and fails those FailNext names.
// It is safe for concurrent use.
type recorder struct {
	mu      sync.Mutex
	calls   []string
	failing map[string]error
}

// FailNext makes the next call of op (a method name, "NewService") fail
// with err, changing nothing.
func (r *recorder) FailNext(op string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing == nil {
		r.failing = map[string]error{}
	}
	r.failing[op] = err
}

// Calls returns the calls so far as "Method arg...", oldest first.
func (r *recorder) Calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// ResetCalls forgets the calls so far.
func (r *recorder) ResetCalls() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = nil
}

// record logs a call of op with args and returns the failure FailNext
// injected for op, if any.
func (r *recorder) record(op string, args ...any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := op
	for _, a := range args {
		c += fmt.Sprint(" ", a)
	}
	r.calls = append(r.calls, c)
	if err := r.failing[op]; err != nil {
		delete(r.failing, op)
		return fmt.Errorf("fake %s: %w", op, err)
	}
	return nil
}
