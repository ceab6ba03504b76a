package netfiltertest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/internal/model"
)

// Fake is an in-memory netfilter.Executor: it parses exactly the input the
// real tools get (iptables-restore with :CHAIN, -A/-I/-D/-X lines; ipset
// restore with -exist: create/add/del/flush/swap/destroy), refuses what
// they would refuse (a jump to a missing chain, a rule naming a missing set,
// a target used from a hook the kernel does not allow it in, destroying a
// set in use), keeps the nat and filter tables of both families and the
// sets, and traces packets through them (Trace, TraceAll). It is safe for
// concurrent use.
type Fake struct {
	mu      sync.Mutex
	k       *model.Kernel
	calls   []Call
	failing map[string]error
	version string
}

// Call is one Executor call the Fake received.
type Call struct {
	Op     string           // "iptables-restore", "iptables-save", "iptables-version", "ipset-restore", "ipset-list", "ipset-names", "ipset-save", "ipset-destroy"
	Family netfilter.Family // iptables calls
	Data   string           // restore input, or the table or set name
}

// NewFake returns a Fake with empty nat and filter tables for both families,
// no sets, reporting the nf_tables backend.
func NewFake() *Fake {
	return &Fake{k: model.NewKernel(), failing: map[string]error{}, version: "iptables v1.8.9 (nf_tables)"}
}

var _ netfilter.Executor = (*Fake)(nil)

// Seed makes Trace's random choices (-m statistic) the sequence seed gives.
// A new Fake is seeded with 1.
func (f *Fake) Seed(seed uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.k.Seed(seed)
}

// Advance moves the clock -m recent ages its entries by.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.k.Advance(d)
}

// SetVersion sets what IPTablesVersion reports.
func (f *Fake) SetVersion(v string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.version = v
}

// FailNext makes the next call of op (a Call.Op) fail with err, changing
// nothing.
func (f *Fake) FailNext(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failing[op] = err
}

// Calls returns every call so far, oldest first.
func (f *Fake) Calls() []Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// CountCalls returns how many calls of op the Fake received.
func (f *Fake) CountCalls(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c.Op == op {
			n++
		}
	}
	return n
}

// ResetCalls forgets the calls so far.
func (f *Fake) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = nil
}

// record logs a call and returns the injected failure for it, if any.
// Callers hold f.mu.
func (f *Fake) record(c Call) error {
	f.calls = append(f.calls, c)
	if err := f.failing[c.Op]; err != nil {
		delete(f.failing, c.Op)
		return fmt.Errorf("fake %s: %w", c.Op, err)
	}
	return nil
}

// IPTablesRestore implements netfilter.Executor.
func (f *Fake) IPTablesRestore(ctx context.Context, family netfilter.Family, data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record(Call{Op: "iptables-restore", Family: family, Data: string(data)}); err != nil {
		return err
	}
	return f.k.IPTablesRestore(family, data)
}

// IPTablesSave implements netfilter.Executor.
func (f *Fake) IPTablesSave(ctx context.Context, family netfilter.Family, tableName string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record(Call{Op: "iptables-save", Family: family, Data: tableName}); err != nil {
		return nil, err
	}
	return f.k.IPTablesSave(family, tableName)
}

// IPTablesSaveChains implements netfilter.Executor.
func (f *Fake) IPTablesSaveChains(ctx context.Context, family netfilter.Family, tableName string, chains []string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record(Call{Op: "iptables-save-chains", Family: family, Data: tableName + " " + strings.Join(chains, " ")}); err != nil {
		return nil, err
	}
	return f.k.IPTablesSaveChains(family, tableName, chains)
}

// IPTablesVersion implements netfilter.Executor.
func (f *Fake) IPTablesVersion(ctx context.Context) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record(Call{Op: "iptables-version"}); err != nil {
		return "", err
	}
	return f.version, nil
}

// IPSetRestore implements netfilter.Executor.
func (f *Fake) IPSetRestore(ctx context.Context, data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record(Call{Op: "ipset-restore", Data: string(data)}); err != nil {
		return err
	}
	return f.k.IPSetRestore(data)
}

// IPSetList implements netfilter.Executor.
func (f *Fake) IPSetList(ctx context.Context, name string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record(Call{Op: "ipset-list", Data: name}); err != nil {
		return nil, err
	}
	return f.k.IPSetList(name)
}

// IPSetSave implements netfilter.Executor: the sets as Dump shows them.
func (f *Fake) IPSetSave(ctx context.Context) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record(Call{Op: "ipset-save"}); err != nil {
		return nil, err
	}
	return f.k.IPSetSave(), nil
}

// IPSetNames implements netfilter.Executor.
func (f *Fake) IPSetNames(ctx context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record(Call{Op: "ipset-names"}); err != nil {
		return nil, err
	}
	return f.k.IPSetNames(), nil
}

// IPSetDestroy implements netfilter.Executor.
func (f *Fake) IPSetDestroy(ctx context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record(Call{Op: "ipset-destroy", Data: name}); err != nil {
		return err
	}
	return f.k.IPSetDestroy(name)
}

// Dump renders everything the Fake holds, as iptables-save (IPv4 then IPv6,
// nat then filter) and ipset save would, in a stable order.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.k.Dump()
}
