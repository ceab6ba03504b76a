package iptables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// DefaultMark is the masquerade mark when Config.Mark is zero: kube-proxy's.
const DefaultMark = 0x4000

// defaultAvoidMark is the forwarder's default SO_MARK (forwarder.DefaultMark),
// which the masquerade mark must not overlap.
const defaultAvoidMark = 0x80000

// Config configures the DNAT mode. The zero value (plus an Exec in tests) is
// usable: mark 0x4000, NodePorts on every node address, no masquerade of
// ClusterIP traffic, IPv4 only.
type Config struct {
	// Mark is the packet mark bit(s) that ask nat POSTROUTING to
	// masquerade. Zero means DefaultMark (0x4000, kube-proxy's).
	Mark uint32
	// AvoidMark are mark bits other parts of svcproxy use (the forwarder's
	// SO_MARK, --mark); Mark must not overlap them. Zero means 0x80000, the
	// forwarder's default.
	AvoidMark uint32
	// NodePortAddresses restricts NodePorts to the node's addresses inside
	// these prefixes. Empty: every local address. A /0 of a family lifts the
	// restriction for that family; a family with no prefix gets no
	// NodePorts. Loopback addresses never serve NodePorts in this mode
	// (DNAT from 127.0.0.1 would need the route_localnet sysctl).
	NodePortAddresses []netip.Prefix
	// ClusterCIDRs are the pod ranges, at most one per family (kube-proxy's
	// --cluster-cidr). ClusterIP traffic from a source outside its family's
	// range (the node itself, hosts routing to ClusterIPs through it) is
	// masqueraded, so replies come back through this node. Empty, and
	// MasqueradeAll off: ClusterIP traffic is never masqueraded (except
	// hairpin), as kube-proxy does without --cluster-cidr.
	ClusterCIDRs []netip.Prefix
	// MasqueradeAll masquerades all traffic sent to ClusterIPs, from pods
	// too (kube-proxy's --masquerade-all); external traffic is masqueraded
	// as without it (Cluster policy), and Local policies keep the client's
	// address.
	MasqueradeAll bool
	// IPv6 also programs ip6tables and the -v6 sets.
	IPv6 bool
	// FullSyncPeriod is how often a full Apply really is one. A full Apply
	// sooner after the last full sync only checks the fixed chains, the
	// jumps into them and the sets (tens of milliseconds at 10,000
	// Services, where a full sync costs seconds), syncs incrementally when
	// they are intact and fully when not. Zero: one hour, kube-proxy's.
	// Negative: every full Apply is a full sync.
	FullSyncPeriod time.Duration
	// Exec runs the kernel tools. Nil: netfilter.NewExec("") (the real
	// tools, in this process's network namespace).
	Exec netfilter.Executor
	// Conntrack clears the entries of packets that reached a frontend
	// before it was served (conntrack.ClearUnNATed), and of UDP flows whose
	// endpoint left (conntrack.DeleteMatching). Nil:
	// conntrack.NewNetlink in Exec's network namespace (a *netfilter.Exec's
	// NetNS; else this process's).
	Conntrack conntrack.Table
	// Logger; nil: no logging.
	Logger *zap.Logger
}

// Mode is the iptables DNAT mode: it programs the kernel to forward Service
// traffic itself. Its methods are safe for concurrent use; calls are
// serialised.
type Mode struct {
	cfg         Config
	exec        netfilter.Executor
	log         *zap.Logger
	backend     string
	version     string
	randomFully bool
	families    []netfilter.Family
	markRule    string

	npRestricted [2]bool
	npAddrs      [2][]netip.Prefix
	nodePorts    [2]bool // the family serves NodePorts at all
	clusterCIDR  [2]netip.Prefix
	npMembers    [2]map[string]struct{} // the NodePort address set's members
	fixed        [2]map[netfilter.ChainKey][]string
	rec          *netfilter.Reconciler

	mu sync.Mutex
	// cur is what the last successful sync left in the kernel; nil when
	// nothing was written yet or a sync failed (the next Apply is a full
	// one).
	cur      *state
	lastFull time.Time        // when the last full sync succeeded
	now      func() time.Time // time.Now; tests move it
	served   conntrack.Served
	ct       *conntrack.Counting // cfg.Conntrack, counted
}

// New validates cfg and detects the iptables backend and version. It does
// not touch the rules; Available checks the kernel can run this mode.
func New(cfg Config) (*Mode, error) {
	if cfg.Mark == 0 {
		cfg.Mark = DefaultMark
	}
	if cfg.AvoidMark == 0 {
		cfg.AvoidMark = defaultAvoidMark
	}
	if cfg.Mark&cfg.AvoidMark != 0 {
		return nil, fmt.Errorf("creating iptables mode: masquerade mark %#x overlaps mark %#x (the forwarder's)", cfg.Mark, cfg.AvoidMark)
	}
	if cfg.Exec == nil {
		cfg.Exec = netfilter.NewExec("")
	}
	if cfg.Conntrack == nil {
		ns := ""
		if e, ok := cfg.Exec.(*netfilter.Exec); ok {
			ns = e.NetNS
		}
		cfg.Conntrack = conntrack.NewNetlink(ns)
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	switch {
	case cfg.FullSyncPeriod == 0:
		cfg.FullSyncPeriod = time.Hour
	case cfg.FullSyncPeriod < 0:
		cfg.FullSyncPeriod = 0
	}
	m := &Mode{cfg: cfg, exec: cfg.Exec, ct: &conntrack.Counting{Table: cfg.Conntrack}, log: cfg.Logger.Named("iptables"), families: []netfilter.Family{netfilter.IPv4}, now: time.Now}
	if cfg.IPv6 {
		m.families = append(m.families, netfilter.IPv6)
	}
	m.markRule = fmt.Sprintf("-j MARK --set-xmark %#x/%#x", cfg.Mark, cfg.Mark)
	var err error
	if m.npRestricted, m.npAddrs, err = netfilter.NodePortPrefixes(cfg.NodePortAddresses); err != nil {
		return nil, fmt.Errorf("creating iptables mode: %w", err)
	}
	for fam := range m.nodePorts {
		m.nodePorts[fam] = !m.npRestricted[fam] || len(m.npAddrs[fam]) > 0
		m.npMembers[fam] = map[string]struct{}{}
		for _, p := range m.npAddrs[fam] {
			if p.IsSingleIP() {
				m.npMembers[fam][p.Addr().String()] = struct{}{}
			} else {
				m.npMembers[fam][p.String()] = struct{}{}
			}
		}
	}
	m.rec = netfilter.NewReconciler(netfilter.ReconcilerConfig{
		Tools: cfg.Exec, ChainPrefix: chainPrefix, SetPrefix: setPrefix,
		Repaired: func(diffs []string) {
			m.served.Reset() // meanwhile packets met no rule: every frontend's entries are suspect
			m.log.Warn("rules or sets were changed behind svcproxy's back; repairing",
				zap.Strings("differences", diffs[:min(len(diffs), 10)]), zap.Int("count", len(diffs)))
		},
	})
	if m.clusterCIDR, err = netfilter.ClusterCIDRs(cfg.ClusterCIDRs); err != nil {
		return nil, fmt.Errorf("creating iptables mode: %w", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := m.exec.IPTablesVersion(ctx)
	if err != nil {
		return nil, fmt.Errorf("detecting iptables backend: %w", err)
	}
	m.version = v
	m.backend = "legacy" // iptables before 1.8 only had legacy and did not say so
	if strings.Contains(v, "nf_tables") {
		m.backend = "nf_tables"
	}
	m.randomFully = versionAtLeast(v, 1, 6, 2)
	for _, fam := range m.families {
		m.fixed[fam] = m.fixedRules(fam)
	}
	m.log.Info("iptables backend detected", zap.String("backend", m.backend), zap.String("version", v),
		zap.Bool("random_fully", m.randomFully))
	return m, nil
}

var versionRE = regexp.MustCompile(`v(\d+)\.(\d+)\.(\d+)`)

// versionAtLeast reports whether `iptables --version` output v names a
// version of at least a.b.c.
func versionAtLeast(v string, a, b, c int) bool {
	m := versionRE.FindStringSubmatch(v)
	if m == nil {
		return false
	}
	var got [3]int
	for i := range got {
		got[i], _ = strconv.Atoi(m[i+1])
	}
	return slices.Compare(got[:], []int{a, b, c}) >= 0
}

// Backend is the iptables backend in use: "nf_tables" or "legacy".
func (m *Mode) Backend() string { return m.backend }

// Repairs counts full syncs that found the rules or sets differing from what
// this Mode last wrote (someone tampered with them) and rewrote them.
func (m *Mode) Repairs() uint64 { return m.rec.Repairs() }

// RestoreFailures counts the iptables-restore runs of this mode's syncs
// that failed for family (kube-proxy's
// kubeproxy_sync_proxy_rules_iptables_restore_failures_total).
func (m *Mode) RestoreFailures(family netfilter.Family) uint64 {
	return m.rec.RestoreFailures(family)
}

// Apply makes the kernel forward snap's Services. It is idempotent. An
// incremental Apply (full false) rewrites only the chains of the Services
// that changed since the last Apply and inserts or deletes their single
// rules in the shared chains, in one iptables-restore per family; a full
// one reads everything back, counts a repair when it differs from what was
// last written, rewrites every chain, and prunes what this mode owns but
// should not be there — once per Config.FullSyncPeriod; in between, a full
// Apply checks the fixed chains and sets and is incremental when they are
// intact. The first Apply, and any Apply after a failed one, is full; an
// incremental one that fails falls back to a full one.
func (m *Mode) Apply(ctx context.Context, snap *lb.Snapshot, full bool) error {
	if snap == nil {
		return errors.New("applying iptables rules: nil snapshot")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	start := time.Now()
	prev := m.cur
	next, changes := m.plan(snap, prev)
	rs := m.ruleset(next)
	var err error
	kind := "incremental"
	if full && prev != nil && m.cfg.FullSyncPeriod > 0 && m.now().Sub(m.lastFull) < m.cfg.FullSyncPeriod {
		switch diffs, cerr := m.rec.Check(ctx); {
		case cerr != nil:
			m.log.Warn("checking the rules failed; doing a full sync", zap.Error(cerr))
		case len(diffs) > 0:
			m.log.Warn("rules or sets changed behind svcproxy's back; doing a full sync", zap.Strings("differences", diffs))
		default:
			full, kind = false, "checked"
		}
	}
	switch {
	case full || prev == nil:
		kind = "full"
		err = m.rec.Sync(ctx, rs, true)
	case len(changes) == 0:
		if kind != "checked" {
			kind = "none"
		}
	default:
		if err = m.rec.Sync(ctx, rs, false); err != nil {
			m.log.Warn("incremental sync failed; doing a full one", zap.Error(err))
			kind = "full"
			err = m.rec.Sync(ctx, rs, true)
		}
	}
	if err != nil {
		m.cur = nil
	} else {
		if kind == "full" {
			m.lastFull = m.now()
		}
		m.cur = next
		m.clearStaleFlows(ctx, changes)
		m.served.Clear(ctx, m.ct, snap, func(bal *lb.Balancer) []lb.Frontend { return conntrack.WithEndpoints(snap, bal, m.cfg.IPv6) }, m.log)
	}
	took := time.Since(start)
	level := zap.DebugLevel
	if kind == "full" && (prev == nil || took > time.Second) {
		level = zap.InfoLevel // the first one, the one after a failure, or a slow one
	}
	m.log.Log(level, "synced", zap.String("sync", kind), zap.Uint64("version", snap.Version),
		zap.Int("services", len(next.svcs)), zap.Int("changed", len(changes)), zap.Duration("duration", took), zap.Error(err))
	return err
}

// UnservedCleared counts the conntrack entries of packets that reached a
// frontend before it was served that the syncs deleted
// (conntrack.Served.Clear).
func (m *Mode) UnservedCleared() uint64 { return m.served.Cleared() }

// ConntrackDeleted counts the conntrack entries of family the syncs
// deleted: those UnservedCleared counts, and the UDP flows of removed
// endpoints.
func (m *Mode) ConntrackDeleted(family netfilter.Family) uint64 { return m.ct.Deleted(family) }

// Cleanup removes every chain, jump and set this mode installs, found by
// name (SVCPROXY-DNAT-* chains and every rule jumping to one,
// svcproxy-dnat-* sets) in both families, also when another process
// installed them. Everything else stays as it was. IPv6 errors are ignored
// when Config.IPv6 is off (the node may have no ip6tables).
func (m *Mode) Cleanup(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cur = nil
	m.rec.Forget()
	m.served.Reset()
	return netfilter.Cleanup(ctx, m.exec, chainPrefix, setPrefix, m.cfg.IPv6)
}

// Close ends the mode on svcproxy's exit. The rules stay, as kube-proxy
// leaves them: Services keep working while svcproxy restarts, and the next
// svcproxy takes them over with its first full sync (handedOver or not).
func (m *Mode) Close(ctx context.Context, handedOver bool) error { return nil }

// Available reports why this node cannot run the DNAT mode, or nil: it
// writes a throwaway chain (SVCPROXY-DNAT-CHECK, removed again) that uses
// every match and target the mode needs (DNAT, statistic, recent,
// conntrack, set with a hash:ip,port,ip set, MARK, MASQUERADE, REJECT) in
// each family. When the kernel refuses MASQUERADE --random-fully, the mode
// masquerades without it from then on. Use it to fall back to another mode.
func (m *Mode) Available(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, fam := range m.families {
		if err := m.probe(ctx, fam); err != nil {
			return fmt.Errorf("iptables DNAT mode unavailable (%v, %s): %w", fam, m.version, err)
		}
	}
	return nil
}

func (m *Mode) probe(ctx context.Context, fam netfilter.Family) error {
	set := setPrefix + "check-" + netfilter.FamilySuffix(fam)
	if err := m.exec.IPSetRestore(ctx, []byte("create "+set+" "+netfilter.SetIPPortIP+" family "+netfilter.InetName(fam)+"\n")); err != nil {
		return fmt.Errorf("creating a hash:ip,port,ip ipset: %w", err)
	}
	defer netfilter.DestroySet(context.WithoutCancel(ctx), m.exec, set)
	lo, dest := "127.0.0.1/32", "127.0.0.1:1"
	if fam == netfilter.IPv6 {
		lo, dest = "::1/128", "[::1]:1"
	}
	const chain = chainPrefix + "CHECK"
	script := func(masq string) []byte {
		return []byte("*nat\n:" + chain + " - [0:0]\n" +
			"-A " + chain + " -d " + lo + " -p tcp -m tcp --dport 1 -m recent --rcheck --seconds 1 --reap --name " + chain + " --mask " + maskAll(fam) + " --rsource -m statistic --mode random --probability 0.5 -j DNAT --to-destination " + dest + "\n" +
			"-A " + chain + " -m conntrack --ctstate DNAT -m set --match-set " + set + " dst,dst,src -m mark --mark 0x1/0x1 " + masq + "\n" +
			"-A " + chain + " ! -s " + lo + " -m addrtype --dst-type LOCAL " + m.markRule + "\n" +
			"COMMIT\n*filter\n:" + chain + " - [0:0]\n" +
			"-A " + chain + " -p tcp -m tcp --dport 1 -j REJECT --reject-with tcp-reset\nCOMMIT\n")
	}
	// Declaring a chain creates it if need be, so this always removes it.
	remove := []byte("*nat\n:" + chain + " - [0:0]\n-X " + chain + "\nCOMMIT\n*filter\n:" + chain + " - [0:0]\n-X " + chain + "\nCOMMIT\n")
	defer m.exec.IPTablesRestore(context.WithoutCancel(ctx), fam, remove)
	masq := "-j MASQUERADE"
	if m.randomFully {
		masq += " --random-fully"
	}
	err := m.exec.IPTablesRestore(ctx, fam, script(masq))
	if err != nil && m.randomFully {
		if err2 := m.exec.IPTablesRestore(ctx, fam, script("-j MASQUERADE")); err2 == nil {
			m.log.Warn("the kernel refuses MASQUERADE --random-fully; masquerading without it", zap.Error(err))
			m.randomFully = false
			for _, f := range m.families {
				m.fixed[f] = m.fixedRules(f)
			}
			m.cur = nil // the next sync rewrites POSTROUTING
			err = nil
		}
	}
	if err != nil {
		return err
	}
	return nil
}
