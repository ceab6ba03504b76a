package redirect

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// Ports are the forwarder ports traffic is steered to.
type Ports struct {
	// TCP is the forwarder's TCP redirect port, the same for both families.
	// It finds each connection's Service with SO_ORIGINAL_DST. Required.
	TCP uint16
	// UDP is, per UDP frontend, the local port of the forwarder's socket for
	// it. A UDP NodePort's key is the unspecified address of the family
	// (0.0.0.0 or ::) and the NodePort. A UDP frontend with endpoints but no
	// entry here is not steered (Apply reports it); one without endpoints
	// is rejected either way.
	//
	// The socket must answer each datagram from the address it arrived at
	// after REDIRECT (read with IP_PKTINFO / IPV6_RECVPKTINFO, sent with
	// it): 127.0.0.1 (::1) for clients on the node, the incoming
	// interface's address for the others. Only then does conntrack match
	// the reply and rewrite its source to the VIP:port the client sent to;
	// a socket bound to 0.0.0.0 that lets the kernel pick the source
	// answers node-local clients from the node's address, and a connected
	// client (a DNS resolver) drops that.
	UDP map[lb.Frontend]uint16
}

// Config configures a Redirector.
type Config struct {
	// Mark is the SO_MARK of the forwarder's upstream sockets; packets
	// carrying it (mask Mark) are never redirected or rejected. Required.
	Mark uint32
	// NodePortAddresses restricts NodePorts to the node's addresses inside
	// these prefixes. Empty: every local address (addrtype LOCAL). A /0 of a
	// family lifts the restriction for that family; a family with no prefix
	// gets no NodePorts.
	NodePortAddresses []netip.Prefix
	// netfilter.IPv6 also programs ip6tables and the -v6 sets.
	IPv6 bool
	// Exec runs the kernel tools. Nil: netfilter.NewExec("") (the real
	// tools, in this process's network namespace).
	Exec netfilter.Executor
	// Logger; nil: no logging.
	Logger *zap.Logger
}

// Redirector owns svcproxy's steering rules and sets. Its methods are safe
// for concurrent use; calls are serialised.
type Redirector struct {
	cfg          Config
	exec         netfilter.Executor
	log          *zap.Logger
	backend      string
	families     []netfilter.Family
	npRestricted [2]bool
	npAddrs      [2][]netip.Prefix

	mu sync.Mutex
	// cur is what the last successful sync wrote; nil when this process
	// wrote nothing yet or a sync failed (the kernel state is then unknown
	// and the next Apply is a full one).
	cur      *desired
	spare    map[member]struct{} // an emptied members map for the next compute
	repairs  atomic.Uint64
	restores netfilter.RestoreFailures
}

// New validates cfg and detects the iptables backend.
func New(cfg Config) (*Redirector, error) {
	if cfg.Mark == 0 {
		return nil, errors.New("creating redirector: mark must not be zero")
	}
	if cfg.Exec == nil {
		cfg.Exec = netfilter.NewExec("")
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	r := &Redirector{cfg: cfg, exec: cfg.Exec, log: cfg.Logger.Named("redirect"), families: []netfilter.Family{netfilter.IPv4}}
	if cfg.IPv6 {
		r.families = append(r.families, netfilter.IPv6)
	}
	var err error
	if r.npRestricted, r.npAddrs, err = netfilter.NodePortPrefixes(cfg.NodePortAddresses); err != nil {
		return nil, fmt.Errorf("creating redirector: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := r.exec.IPTablesVersion(ctx)
	if err != nil {
		return nil, fmt.Errorf("detecting iptables backend: %w", err)
	}
	switch {
	case strings.Contains(v, "nf_tables"):
		r.backend = "nf_tables"
	case strings.Contains(v, "legacy"):
		r.backend = "legacy"
	default:
		// iptables before 1.8 only had the legacy backend and did not say so.
		r.backend = "legacy"
	}
	r.log.Info("iptables backend detected", zap.String("backend", r.backend), zap.String("version", v))
	return r, nil
}

// Backend is the iptables backend in use: "nf_tables" or "legacy".
func (r *Redirector) Backend() string { return r.backend }

// Repairs counts full syncs that found the rules or sets differing from what
// this Redirector last wrote (someone tampered with them) and rewrote them.
func (r *Redirector) Repairs() uint64 { return r.repairs.Load() }

// RestoreFailures counts the iptables-restore runs of this Redirector's syncs
// that failed for family (kube-proxy's
// kubeproxy_sync_proxy_rules_iptables_restore_failures_total).
func (r *Redirector) RestoreFailures(family netfilter.Family) uint64 { return r.restores.Count(family) }

// wantedSets are the sets this configuration uses.
func (r *Redirector) wantedSets() []setID {
	ids := []setID{setSvc4, setReject4}
	if r.npRestricted[netfilter.IPv4] {
		ids = append(ids, setNPAddrs4)
	}
	if r.cfg.IPv6 {
		ids = append(ids, setSvc6, setReject6)
		if r.npRestricted[netfilter.IPv6] {
			ids = append(ids, setNPAddrs6)
		}
	}
	return append(ids, setNPTCP, setNPUDP, setNPRejectTCP, setNPRejectUDP)
}

// Apply makes the kernel steer snap's Services to ports. It is idempotent.
// full rewrites every rule and set and prunes whatever svcproxy owns but
// should not be there (repairing tampering); otherwise only the set members
// that differ from the last Apply are written, and iptables is touched only
// when the rules themselves change (UDP frontends, ports). The first Apply,
// and any Apply after a failed one, is full. A Service that cannot be
// programmed does not stop the others: the error joins them all.
func (r *Redirector) Apply(ctx context.Context, snap *lb.Snapshot, ports Ports, full bool) error {
	if snap == nil {
		return errors.New("applying rules: nil snapshot")
	}
	if ports.TCP == 0 {
		return errors.New("applying rules: no TCP redirect port")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	start := time.Now()
	want, errs := r.compute(snap, ports, r.spare)
	r.spare = nil
	var err error
	switch {
	case full || r.cur == nil:
		err = r.fullSync(ctx, want)
	default:
		if err = r.partialSync(ctx, want); err != nil {
			r.log.Warn("incremental sync failed; doing a full one", zap.Error(err))
			err = r.fullSync(ctx, want)
		}
	}
	old := r.cur
	if err != nil {
		r.cur = nil
	} else {
		r.cur = want
	}
	// Reusing the old members map saves the garbage collector a
	// 10,000-entry map per Apply; but not one sized for far more than
	// wanted now (a map never shrinks), so that memory goes back after a
	// large configuration shrinks.
	if old != nil && old != r.cur && len(old.members) <= 2*len(want.members)+1024 {
		clear(old.members)
		r.spare = old.members
	}
	r.log.Debug("applied", zap.Bool("full", full), zap.Uint64("version", snap.Version),
		zap.Int("members", len(want.members)), zap.Duration("duration", time.Since(start)), zap.Error(err))
	return errors.Join(append(errs, err)...)
}

// partialSync writes the difference between r.cur and want.
func (r *Redirector) partialSync(ctx context.Context, want *desired) error {
	var b strings.Builder
	for m := range want.members {
		if _, ok := r.cur.members[m]; !ok {
			fmt.Fprintf(&b, "add %s %s\n", setDefs[m.set].name, m)
		}
	}
	for m := range r.cur.members {
		if _, ok := want.members[m]; !ok {
			fmt.Fprintf(&b, "del %s %s\n", setDefs[m.set].name, m)
		}
	}
	if b.Len() > 0 {
		if err := r.exec.IPSetRestore(ctx, []byte(b.String())); err != nil {
			return fmt.Errorf("updating ipsets: %w", err)
		}
	}
	for _, fam := range r.families {
		if sameRules(want.rules[fam], r.cur.rules[fam]) {
			continue
		}
		if err := r.restores.Restore(ctx, r.exec, fam, ruleScript(want.rules[fam], nil, nil)); err != nil {
			return fmt.Errorf("updating %v rules: %w", fam, err)
		}
	}
	return nil
}

// observed is what a full sync found in the kernel.
type observed struct {
	// per family: the rules of each SVCPROXY-* chain, and the rules of
	// other chains that jump to one (as "table chain spec").
	chains [2]map[chainKey][]string
	jumps  [2][]jumpRule
	sets   map[string]bool    // every svcproxy- set that exists
	member map[setID][]string // canonical members of each wanted set that exists
}

type jumpRule struct {
	table, chain, spec, target string
	plain                      bool // just "-j target"
}

// observe reads the current rules and sets.
func (r *Redirector) observe(ctx context.Context) (*observed, error) {
	o := &observed{sets: map[string]bool{}, member: map[setID][]string{}}
	for _, fam := range r.families {
		chains, jumps, err := r.readRules(ctx, fam)
		if err != nil {
			return nil, err
		}
		o.chains[fam], o.jumps[fam] = chains, jumps
	}
	names, err := r.exec.IPSetNames(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing ipsets: %w", err)
	}
	for _, n := range names {
		if strings.HasPrefix(n, setPrefix) && (r.cfg.IPv6 || !isV6Set(n)) {
			o.sets[n] = true
		}
	}
	for _, id := range r.wantedSets() {
		d := setDefs[id]
		if !o.sets[d.name] {
			continue
		}
		raw, err := r.exec.IPSetList(ctx, d.name)
		if errors.Is(err, netfilter.ErrNoSet) {
			delete(o.sets, d.name)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listing ipset %s: %w", d.name, err)
		}
		ms := make([]string, 0, len(raw))
		for _, m := range raw {
			c, err := netfilter.CanonicalMembers(d.typ, d.family, m)
			if err != nil {
				c = []string{"unparsable:" + m}
			}
			ms = append(ms, c...)
		}
		o.member[id] = ms
	}
	return o, nil
}

// isV6Set reports whether name is (the temporary of) an netfilter.IPv6-only set, which
// a full sync without netfilter.IPv6 leaves alone: ip6tables rules may still use it
// until Cleanup.
func isV6Set(name string) bool {
	for _, id := range []setID{setSvc6, setReject6, setNPAddrs6} {
		if n := setDefs[id].name; name == n || name == tmpName(n) {
			return true
		}
	}
	return false
}

// readRules parses iptables-save of nat and filter for fam and returns
// svcproxy's chains and every rule elsewhere that jumps into one.
func (r *Redirector) readRules(ctx context.Context, fam netfilter.Family) (map[chainKey][]string, []jumpRule, error) {
	owned, err := netfilter.ReadOwnedTables(ctx, r.exec, fam, chainPrefix)
	if err != nil {
		return nil, nil, err
	}
	chains := map[chainKey][]string{}
	var jumps []jumpRule
	for _, tbl := range netfilter.OwnedTables {
		owned := owned[tbl]
		for name, rs := range owned.Chains {
			chains[chainKey{tbl, name}] = rs
		}
		for _, j := range owned.Jumps {
			jumps = append(jumps, jumpRule{table: tbl, chain: j.Chain, spec: j.Spec, target: j.Target, plain: j.Plain})
		}
	}
	return chains, jumps, nil
}

// differs lists how o differs from what r.cur says was written.
func (r *Redirector) differs(o *observed) []string {
	var diffs []string
	for _, fam := range r.families {
		for _, k := range ourChains {
			got, ok := o.chains[fam][k]
			if !ok {
				diffs = append(diffs, fmt.Sprintf("%v %s chain %s missing", fam, k.table, k.chain))
			} else if !slices.Equal(got, r.cur.rules[fam][k]) {
				diffs = append(diffs, fmt.Sprintf("%v %s chain %s changed", fam, k.table, k.chain))
			}
		}
		for k := range o.chains[fam] {
			if !slices.Contains(ourChains, k) {
				diffs = append(diffs, fmt.Sprintf("%v %s chain %s is not ours", fam, k.table, k.chain))
			}
		}
		keep, del := r.jumpPlan(o.jumps[fam])
		for _, j := range ourJumps {
			if !keep[j] {
				diffs = append(diffs, fmt.Sprintf("%v jump %s %s -> %s missing", fam, j.table, j.from, j.to))
			}
		}
		for _, j := range del {
			diffs = append(diffs, fmt.Sprintf("%v stray rule %s %s %s", fam, j.table, j.chain, j.spec))
		}
	}
	want := map[setID][]string{}
	for m := range r.cur.members {
		want[m.set] = append(want[m.set], m.String())
	}
	for _, id := range r.wantedSets() {
		name := setDefs[id].name
		if !o.sets[name] {
			diffs = append(diffs, "set "+name+" missing")
			continue
		}
		got, w := slices.Clone(o.member[id]), want[id]
		slices.Sort(got)
		slices.Sort(w)
		if !slices.Equal(got, w) {
			diffs = append(diffs, fmt.Sprintf("set %s has %d members, want %d (or different ones)", name, len(got), len(w)))
		}
	}
	for name := range o.sets {
		if !slices.ContainsFunc(r.wantedSets(), func(id setID) bool { return setDefs[id].name == name }) {
			diffs = append(diffs, "set "+name+" is not ours")
		}
	}
	slices.Sort(diffs)
	return diffs
}

// jumpPlan splits the jump rules found into our wanted jumps (kept, once
// each) and the rest (to delete).
func (r *Redirector) jumpPlan(found []jumpRule) (keep map[jump]bool, del []jumpRule) {
	keep = map[jump]bool{}
	for _, j := range found {
		k := jump{j.table, j.chain, j.target}
		if j.plain && slices.Contains(ourJumps, k) && !keep[k] {
			keep[k] = true
			continue
		}
		del = append(del, j)
	}
	return keep, del
}

// fullSync rewrites everything and prunes what is not wanted.
func (r *Redirector) fullSync(ctx context.Context, want *desired) error {
	start := time.Now()
	o, err := r.observe(ctx)
	if err != nil {
		return err
	}
	if r.cur != nil {
		if diffs := r.differs(o); len(diffs) > 0 {
			r.repairs.Add(1)
			r.log.Warn("rules or sets were changed behind svcproxy's back; repairing",
				zap.Strings("differences", diffs[:min(len(diffs), 10)]), zap.Int("count", len(diffs)))
		}
	}

	// Sets first: the rules reference them.
	bySet := map[setID][]string{}
	for m := range want.members {
		bySet[m.set] = append(bySet[m.set], m.String())
	}
	var b strings.Builder
	for _, id := range r.wantedSets() {
		d := setDefs[id]
		members := bySet[id]
		slices.Sort(members)
		tmp := tmpName(d.name)
		if !o.sets[d.name] {
			b.WriteString(d.createLine(d.name, len(members)) + "\n")
		}
		if o.sets[tmp] {
			b.WriteString("destroy " + tmp + "\n")
		}
		b.WriteString(d.createLine(tmp, len(members)) + "\n")
		for _, m := range members {
			fmt.Fprintf(&b, "add %s %s\n", tmp, m)
		}
		fmt.Fprintf(&b, "swap %s %s\ndestroy %s\n", tmp, d.name, tmp)
		delete(o.sets, tmp)
	}
	if err := r.exec.IPSetRestore(ctx, []byte(b.String())); err != nil {
		return fmt.Errorf("writing ipsets: %w", err)
	}

	for _, fam := range r.families {
		extra, tail := map[string][]string{}, map[string][]string{}
		for k := range o.chains[fam] {
			if !slices.Contains(ourChains, k) {
				extra[k.table] = append(extra[k.table], ":"+k.chain+" - [0:0]")
				tail[k.table] = append(tail[k.table], "-X "+k.chain)
			}
		}
		keep, del := r.jumpPlan(o.jumps[fam])
		for _, j := range del {
			extra[j.table] = append(extra[j.table], "-D "+j.chain+" "+j.spec)
		}
		for _, j := range ourJumps {
			if !keep[j] {
				extra[j.table] = append(extra[j.table], "-I "+j.from+" 1 -j "+j.to)
			}
		}
		for _, lines := range tail {
			slices.Sort(lines)
		}
		if err := r.restores.Restore(ctx, r.exec, fam, ruleScript(want.rules[fam], sortDecl(extra), tail)); err != nil {
			return fmt.Errorf("writing %v rules: %w", fam, err)
		}
	}

	// Sets no rule references any more.
	var errs []error
	for name := range o.sets {
		if slices.ContainsFunc(r.wantedSets(), func(id setID) bool { return setDefs[id].name == name }) {
			continue
		}
		if err := netfilter.DestroySet(ctx, r.exec, name); err != nil {
			errs = append(errs, err)
		}
	}
	level := zap.DebugLevel
	if took := time.Since(start); r.cur == nil || took > time.Second {
		level = zap.InfoLevel // the first one, the one after a failure, or a slow one
	}
	r.log.Log(level, "full sync", zap.Int("members", len(want.members)), zap.Duration("duration", time.Since(start)))
	return errors.Join(errs...)
}

// sortDecl puts chain declarations before the other lines of each table, as
// iptables-restore wants them.
func sortDecl(extra map[string][]string) map[string][]string {
	for t, lines := range extra {
		slices.SortStableFunc(lines, func(a, b string) int {
			ad, bd := strings.HasPrefix(a, ":"), strings.HasPrefix(b, ":")
			switch {
			case ad && !bd:
				return -1
			case bd && !ad:
				return 1
			}
			return 0
		})
		extra[t] = lines
	}
	return extra
}

// Cleanup removes every rule, chain and set svcproxy installs, found by name
// (SVCPROXY-* chains and every rule jumping to one, svcproxy-* sets) in
// both families, also when another process installed them: this covers the
// kernel modes' SVCPROXY-DNAT-* and SVCPROXY-IPVS-* too, which is what
// `svcproxy --cleanup` wants. Everything else in the tables stays as it
// was. IPv6 errors are ignored when Config.IPv6 is off (the node may have
// no ip6tables).
func (r *Redirector) Cleanup(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cur = nil
	return netfilter.Cleanup(ctx, r.exec, chainPrefix, setPrefix, r.cfg.IPv6)
}
