package netfilter_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
)

// recorder wraps an Executor: it records every restore's input and fails
// the next call of an op on demand, for the Fake and the real tools alike.
type recorder struct {
	netfilter.Executor
	mu       sync.Mutex
	restores []string // "iptables-restore IPv4\n<input>" or "ipset-restore\n<input>"
	reads    int      // iptables-save and ipset save runs
	fail     string   // op to fail next: "iptables-restore", "ipset-restore"
}

var errInjected = errors.New("injected failure")

func (r *recorder) take(op string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail == op {
		r.fail = ""
		return errInjected
	}
	return nil
}

func (r *recorder) IPTablesRestore(ctx context.Context, f netfilter.Family, data []byte) error {
	if err := r.take("iptables-restore"); err != nil {
		return err
	}
	r.mu.Lock()
	r.restores = append(r.restores, "iptables-restore "+f.String()+"\n"+string(data))
	r.mu.Unlock()
	return r.Executor.IPTablesRestore(ctx, f, data)
}

func (r *recorder) IPSetRestore(ctx context.Context, data []byte) error {
	if err := r.take("ipset-restore"); err != nil {
		return err
	}
	r.mu.Lock()
	r.restores = append(r.restores, "ipset-restore\n"+string(data))
	r.mu.Unlock()
	return r.Executor.IPSetRestore(ctx, data)
}

func (r *recorder) IPTablesSave(ctx context.Context, f netfilter.Family, table string) ([]byte, error) {
	r.mu.Lock()
	r.reads++
	r.mu.Unlock()
	return r.Executor.IPTablesSave(ctx, f, table)
}

func (r *recorder) IPSetSave(ctx context.Context) ([]byte, error) {
	r.mu.Lock()
	r.reads++
	r.mu.Unlock()
	return r.Executor.IPSetSave(ctx)
}

// reset forgets the restores and reads so far.
func (r *recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.restores, r.reads = nil, 0
}

// testPart is one "Service": its own chain, a dispatch rule and a hairpin
// member per endpoint.
func testPart(t testing.TB, name, vip string, eps ...string) *netfilter.Part {
	chain := "TEST-S-" + name
	p := &netfilter.Part{
		Chains:  map[netfilter.ChainKey][]string{netfilter.Nat(chain): nil},
		Rules:   map[netfilter.ChainKey][]string{netfilter.Nat("TEST-SERVICES"): {canon(t, "-d "+vip+"/32 -p tcp -m tcp --dport 80 -j "+chain)}},
		Members: map[string][]string{"test-hairpin-v4": nil},
	}
	for i, ep := range eps {
		rule := "-p tcp -j DNAT --to-destination " + ep + ":8080"
		if i < len(eps)-1 {
			rule = "-p tcp -m statistic --mode random --probability 0.50000000000 -j DNAT --to-destination " + ep + ":8080"
		}
		p.Chains[netfilter.Nat(chain)] = append(p.Chains[netfilter.Nat(chain)], canon(t, rule))
		p.Members["test-hairpin-v4"] = append(p.Members["test-hairpin-v4"], ep+",tcp:8080,"+ep)
	}
	return p
}

func canon(t testing.TB, rule string) string {
	t.Helper()
	c, err := netfilter.Canonical(netfilter.IPv4, rule)
	if err != nil {
		t.Fatalf("Canonical(%q): %v", rule, err)
	}
	return c
}

// testRuleset is an IPv4 ruleset shaped like the modes': a dispatch chain
// Parts add to with a fixed tail, fixed chains in nat and filter, entries
// into them, and three sets (one filled by Parts).
func testRuleset(t testing.TB, parts map[string]*netfilter.Part) *netfilter.Ruleset {
	rs := netfilter.NewRuleset(netfilter.IPv4)
	rs.Chains[netfilter.IPv4] = map[netfilter.ChainKey][]string{
		netfilter.Nat("TEST-SERVICES"):  {canon(t, "-m addrtype --dst-type LOCAL -j TEST-NODEPORTS")},
		netfilter.Nat("TEST-NODEPORTS"): {canon(t, "-p tcp -m set --match-set test-np dst -j RETURN")},
		netfilter.Nat("TEST-POST"):      {canon(t, "-m set --match-set test-hairpin-v4 dst,dst,src -j MASQUERADE")},
		netfilter.Filter("TEST-FILTER"): {canon(t, "-p tcp -m set --match-set test-reject-v4 dst,dst -j REJECT --reject-with tcp-reset")},
	}
	rs.Entries[netfilter.IPv4] = []netfilter.Entry{
		{Table: "nat", From: "PREROUTING", To: "TEST-SERVICES"},
		{Table: "nat", From: "OUTPUT", To: "TEST-SERVICES", Match: "-m addrtype --dst-type LOCAL"},
		{Table: "nat", From: "POSTROUTING", To: "TEST-POST"},
		{Table: "filter", From: "INPUT", To: "TEST-FILTER"},
	}
	rs.Parts[netfilter.IPv4] = parts
	for _, s := range []*netfilter.Set{
		netfilter.SetDef{Name: "test-hairpin-v4", Type: netfilter.SetIPPortIP}.With(nil),
		netfilter.SetDef{Name: "test-reject-v4", Type: netfilter.SetIPPort}.With(map[string]struct{}{"10.96.0.9,tcp:80": {}}),
		netfilter.SetDef{Name: "test-np", Type: netfilter.SetPort}.With(map[string]struct{}{"30080": {}}),
	} {
		rs.Sets[s.Name] = s
	}
	return rs
}

func baseParts(t testing.TB) map[string]*netfilter.Part {
	return map[string]*netfilter.Part{
		"a": testPart(t, "A", "10.96.0.1", "10.1.0.1", "10.1.0.2"),
		"b": testPart(t, "B", "10.96.0.2", "10.1.0.3"),
	}
}

// foreign is what another program keeps in the same tables and sets.
const (
	foreignRules = "*nat\n:FOREIGN - [0:0]\n-A PREROUTING -j FOREIGN\n-A FOREIGN -p tcp -m tcp --dport 22 -j RETURN\nCOMMIT\n" +
		"*filter\n-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\nCOMMIT\n"
	foreignSets = "create foreign hash:net family inet\nadd foreign 10.8.0.0/16\n"
)

// snapshot renders what e holds of IPv4 and the sets, comparable between
// two environments of the same kind (lines sorted: hash sets list members
// in no particular order).
func snapshot(t testing.TB, e netfilter.Executor) string {
	t.Helper()
	ctx := context.Background()
	var lines []string
	for _, tbl := range netfilter.OwnedTables {
		out, err := e.IPTablesSave(ctx, netfilter.IPv4, tbl)
		if err != nil {
			t.Fatal(err)
		}
		for l := range strings.Lines(string(out)) {
			if !strings.HasPrefix(l, "#") {
				lines = append(lines, tbl+": "+strings.TrimSpace(l))
			}
		}
	}
	out, err := e.IPSetSave(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(string(out)) {
		f := strings.Fields(l)
		if len(f) >= 3 && f[0] == "create" {
			l = strings.Join(f[:3], " ") // sizes differ with the members a set was made for
		}
		lines = append(lines, strings.TrimSpace(l))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// reconcilerEnv makes a fresh kernel to reconcile (the Fake, or a
// namespace), with the foreign rules and sets in it.
type reconcilerEnv func(t *testing.T) netfilter.Executor

func newEnv(t *testing.T, env reconcilerEnv) (*recorder, *netfilter.Reconciler) {
	t.Helper()
	ctx := context.Background()
	e := env(t)
	if err := e.IPSetRestore(ctx, []byte(foreignSets)); err != nil {
		t.Fatal(err)
	}
	if err := e.IPTablesRestore(ctx, netfilter.IPv4, []byte(foreignRules)); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{Executor: e}
	return rec, netfilter.NewReconciler(netfilter.ReconcilerConfig{Tools: rec, ChainPrefix: "TEST-", SetPrefix: "test-"})
}

func mustSync(t *testing.T, r *netfilter.Reconciler, want *netfilter.Ruleset, full bool) {
	t.Helper()
	if err := r.Sync(context.Background(), want, full); err != nil {
		t.Fatalf("Sync(full=%v): %v", full, err)
	}
}

// checkConverged compares e with a fresh environment that had only want
// written by a full sync.
func checkConverged(t *testing.T, env reconcilerEnv, e netfilter.Executor, want *netfilter.Ruleset) {
	t.Helper()
	ref, rr := newEnv(t, env)
	mustSync(t, rr, want, true)
	if got, want := snapshot(t, e), snapshot(t, ref); got != want {
		t.Errorf("kernel differs from a fresh full sync:\n%s\nwant:\n%s", got, want)
	}
}

// restoreLines returns the lines of each recorded restore, in order,
// without the table and COMMIT lines.
func restoreLines(r *recorder) map[string][]string {
	out := map[string][]string{}
	for _, rs := range r.restores {
		head, body, _ := strings.Cut(rs, "\n")
		for l := range strings.Lines(body) {
			if l = strings.TrimSpace(l); l != "COMMIT" && !strings.HasPrefix(l, "*") {
				out[head] = append(out[head], l)
			}
		}
	}
	return out
}

func runReconcilerPartial(t *testing.T, env reconcilerEnv) {
	moved := func(t testing.TB) map[string]*netfilter.Part {
		p := baseParts(t)
		p["a"] = testPart(t, "A", "10.96.0.1", "10.1.0.1", "10.1.0.4")
		return p
	}
	added := func(t testing.TB) map[string]*netfilter.Part {
		p := baseParts(t)
		p["c"] = testPart(t, "C", "10.96.0.3", "10.1.0.1")
		return p
	}
	removed := func(t testing.TB) map[string]*netfilter.Part {
		p := baseParts(t)
		delete(p, "b")
		return p
	}
	for _, tc := range []struct {
		name  string
		parts func(testing.TB) map[string]*netfilter.Part
		same  bool // keep the Parts that did not change by pointer
		want  map[string][]string
	}{
		{name: "nothing changed", parts: baseParts, same: true, want: map[string][]string{}},
		{name: "nothing changed, new Parts", parts: baseParts, want: map[string][]string{}},
		{name: "an endpoint changed: one chain, one member each way", parts: moved, same: true, want: map[string][]string{
			"iptables-restore IPv4": {":TEST-S-A - [0:0]",
				"-A TEST-S-A -p tcp -m statistic --mode random --probability 0.50000000000 -j DNAT --to-destination 10.1.0.1:8080",
				"-A TEST-S-A -p tcp -j DNAT --to-destination 10.1.0.4:8080"},
			"ipset-restore": {"add test-hairpin-v4 10.1.0.4,6:8080,10.1.0.4", "del test-hairpin-v4 10.1.0.2,6:8080,10.1.0.2"},
		}},
		{name: "a Part added: its chain and one inserted rule; a shared member stays", parts: added, same: true, want: map[string][]string{
			"iptables-restore IPv4": {":TEST-S-C - [0:0]",
				"-A TEST-S-C -p tcp -j DNAT --to-destination 10.1.0.1:8080",
				"-I TEST-SERVICES 1 -d 10.96.0.3/32 -p tcp -m tcp --dport 80 -j TEST-S-C"},
		}},
		{name: "a Part removed: its rule deleted, its chain removed", parts: removed, same: true, want: map[string][]string{
			"iptables-restore IPv4": {":TEST-S-B - [0:0]",
				"-D TEST-SERVICES -d 10.96.0.2/32 -p tcp -m tcp --dport 80 -j TEST-S-B",
				"-X TEST-S-B"},
			"ipset-restore": {"del test-hairpin-v4 10.1.0.3,6:8080,10.1.0.3"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, r := newEnv(t, env)
			base := baseParts(t)
			mustSync(t, r, testRuleset(t, base), true)
			next := tc.parts(t)
			if tc.same {
				for k, p := range next {
					if o := base[k]; o != nil && slices.Equal(o.Chains[netfilter.Nat("TEST-S-"+strings.ToUpper(k))], p.Chains[netfilter.Nat("TEST-S-"+strings.ToUpper(k))]) {
						next[k] = o
					}
				}
			}
			e.reset()
			want := testRuleset(t, next)
			mustSync(t, r, want, false)
			if e.reads != 0 {
				t.Errorf("an incremental sync read the kernel %d times", e.reads)
			}
			if got := restoreLines(e); !equalLines(got, tc.want) {
				t.Errorf("restored:\n%q\nwant:\n%q", got, tc.want)
			}
			checkConverged(t, env, e.Executor, want)
			if r.Repairs() != 0 {
				t.Errorf("Repairs = %d", r.Repairs())
			}
		})
	}
}

func equalLines(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, x := range a {
		if !slices.Equal(x, b[k]) {
			return false
		}
	}
	return true
}

// tamperCases change what a Reconciler wrote behind its back.
var tamperCases = []struct {
	name       string
	rules, set string
}{
	{name: "a flushed chain", rules: "*nat\n-F TEST-S-A\nCOMMIT\n"},
	{name: "a flushed shared chain", rules: "*nat\n-F TEST-SERVICES\nCOMMIT\n"},
	{name: "a deleted jump", rules: "*nat\n-D PREROUTING -j TEST-SERVICES\nCOMMIT\n"},
	{name: "a deleted jump with a match", rules: "*nat\n-D OUTPUT -m addrtype --dst-type LOCAL -j TEST-SERVICES\nCOMMIT\n"},
	{name: "a duplicate jump", rules: "*filter\n-A INPUT -j TEST-FILTER\nCOMMIT\n"},
	{name: "a jump that lost its match", rules: "*nat\n-D OUTPUT -m addrtype --dst-type LOCAL -j TEST-SERVICES\n-A OUTPUT -j TEST-SERVICES\nCOMMIT\n"},
	{name: "a foreign rule in an owned chain", rules: "*nat\n-I TEST-NODEPORTS 1 -p udp -j RETURN\nCOMMIT\n"},
	{name: "a foreign rule in the shared chain", rules: "*nat\n-I TEST-SERVICES 1 -d 10.96.0.7/32 -j RETURN\nCOMMIT\n"},
	{name: "a missing set member", set: "del test-reject-v4 10.96.0.9,tcp:80\n"},
	{name: "a missing Part member", set: "del test-hairpin-v4 10.1.0.1,tcp:8080,10.1.0.1\n"},
	{name: "an extra set member", set: "add test-hairpin-v4 10.9.9.9,tcp:1,10.9.9.9\n"},
	{name: "an extra owned set", set: "create test-junk hash:net family inet\nadd test-junk 10.7.0.0/16\n"},
	{name: "a missing set", rules: "*filter\n-F TEST-FILTER\nCOMMIT\n", set: "destroy test-reject-v4\n"},
	{name: "an extra owned chain and a jump into it", rules: "*nat\n:TEST-JUNK - [0:0]\n-A TEST-JUNK -j RETURN\n-A OUTPUT -j TEST-JUNK\nCOMMIT\n"},
	{name: "an owned chain missing", rules: "*nat\n-D TEST-SERVICES -d 10.96.0.2/32 -p tcp -m tcp --dport 80 -j TEST-S-B\n-F TEST-S-B\n-X TEST-S-B\nCOMMIT\n"},
}

func runReconcilerRepairs(t *testing.T, env reconcilerEnv) {
	ctx := context.Background()
	for _, tc := range tamperCases {
		t.Run(tc.name, func(t *testing.T) {
			e, r := newEnv(t, env)
			want := testRuleset(t, baseParts(t))
			mustSync(t, r, want, true)
			if tc.rules != "" {
				if err := e.Executor.IPTablesRestore(ctx, netfilter.IPv4, []byte(tc.rules)); err != nil {
					t.Fatal(err)
				}
			}
			if tc.set != "" {
				if err := e.Executor.IPSetRestore(ctx, []byte(tc.set)); err != nil {
					t.Fatal(err)
				}
			}
			// An incremental sync trusts what it wrote...
			mustSync(t, r, want, false)
			if r.Repairs() != 0 {
				t.Errorf("Repairs = %d after an incremental sync", r.Repairs())
			}
			// ... a full one finds and repairs the tampering ...
			mustSync(t, r, want, true)
			if r.Repairs() != 1 {
				t.Errorf("Repairs = %d, want 1", r.Repairs())
			}
			checkConverged(t, env, e.Executor, want)
			// ... and the next finds nothing.
			mustSync(t, r, want, true)
			if r.Repairs() != 1 {
				t.Errorf("Repairs = %d after a clean full sync, want still 1", r.Repairs())
			}
		})
	}
}

func runReconcilerFailures(t *testing.T, env reconcilerEnv) {
	for _, op := range []string{"iptables-restore", "ipset-restore"} {
		t.Run(op, func(t *testing.T) {
			e, r := newEnv(t, env)
			mustSync(t, r, testRuleset(t, baseParts(t)), true)
			next := baseParts(t)
			next["a"] = testPart(t, "A", "10.96.0.1", "10.1.0.5")
			next["c"] = testPart(t, "C", "10.96.0.3", "10.1.0.6")
			want := testRuleset(t, next)
			e.fail = op
			if err := r.Sync(context.Background(), want, false); !errors.Is(err, errInjected) {
				t.Fatalf("Sync = %v, want the injected failure", err)
			}
			wantFailures := uint64(0)
			if op == "iptables-restore" {
				wantFailures = 1
			}
			if n := r.RestoreFailures(netfilter.IPv4); n != wantFailures {
				t.Errorf("RestoreFailures(IPv4) = %d, want %d", n, wantFailures)
			}
			e.reset()
			mustSync(t, r, want, false) // full, after the failure
			if e.reads == 0 {
				t.Error("the Sync after a failure did not read the kernel: not a full one")
			}
			if r.Repairs() != 0 {
				t.Errorf("Repairs = %d; a failed write is not tampering", r.Repairs())
			}
			checkConverged(t, env, e.Executor, want)
			e.reset()
			mustSync(t, r, want, false)
			if e.reads != 0 || len(e.restores) != 0 {
				t.Errorf("the next incremental sync read %d times and wrote %q", e.reads, e.restores)
			}
		})
	}
}

func fakeEnv(t *testing.T) netfilter.Executor { return netfiltertest.NewFake() }

func TestReconcilerPartial(t *testing.T)  { runReconcilerPartial(t, fakeEnv) }
func TestReconcilerRepairs(t *testing.T)  { runReconcilerRepairs(t, fakeEnv) }
func TestReconcilerFailures(t *testing.T) { runReconcilerFailures(t, fakeEnv) }

// TestReconcilerCleanup: after Cleanup and Forget, nothing owned is left
// and the next Sync starts afresh without counting a repair.
func TestReconcilerCleanup(t *testing.T) {
	e, r := newEnv(t, fakeEnv)
	want := testRuleset(t, baseParts(t))
	mustSync(t, r, want, true)
	if err := netfilter.Cleanup(context.Background(), e, "TEST-", "test-", false); err != nil {
		t.Fatal(err)
	}
	r.Forget()
	ref, _ := newEnv(t, fakeEnv)
	if got, want := snapshot(t, e), snapshot(t, ref); got != want {
		t.Errorf("after Cleanup:\n%s\nwant only the foreign rules:\n%s", got, want)
	}
	mustSync(t, r, want, false)
	checkConverged(t, fakeEnv, e.Executor, want)
	if r.Repairs() != 0 {
		t.Errorf("Repairs = %d after Forget", r.Repairs())
	}
}

// TestReconcilerSetDefinitionChange: a set whose type changes is replaced
// (its rules dropped and rewritten), not swapped (which ipset refuses).
func TestReconcilerSetDefinitionChange(t *testing.T) {
	e, r := newEnv(t, fakeEnv)
	mustSync(t, r, testRuleset(t, baseParts(t)), true)
	want := testRuleset(t, baseParts(t))
	want.Sets["test-reject-v4"] = netfilter.SetDef{Name: "test-reject-v4", Type: netfilter.SetNet}.With(map[string]struct{}{"10.96.0.0/24": {}})
	want.Chains[netfilter.IPv4][netfilter.Filter("TEST-FILTER")] = []string{canon(t, "-p tcp -m set --match-set test-reject-v4 dst -j REJECT --reject-with tcp-reset")}
	mustSync(t, r, want, false)
	checkConverged(t, fakeEnv, e.Executor, want)
	if r.Repairs() != 0 {
		t.Errorf("Repairs = %d; a changed set definition is not tampering", r.Repairs())
	}
}
