package ipvs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/sysctl"
)

// DummyInterface holds every virtual IP. It is left down.
const DummyInterface = "svcproxy-ipvs0"

// DefaultMark is the masquerade mark when Config.Mark is zero (kube-proxy's
// KUBE-MARK-MASQ bit).
const DefaultMark = 0x4000

// Schedulers are the IPVS schedulers Config.Scheduler accepts.
var Schedulers = []string{"rr", "wrr", "lc", "wlc", "sh", "dh", "mh"}

// Config configures a Mode. The zero value, with the real kernel, is usable.
type Config struct {
	// Scheduler is the IPVS scheduler of Services that name no algorithm
	// (lb.AlgorithmDefault, or random, which IPVS lacks): rr, wrr, lc, wlc,
	// sh, dh or mh. "": rr. A Service naming round-robin, least-conn or
	// maglev gets rr, lc or mh.
	Scheduler string
	// Mark is the masquerade mark bit(s): packets that carry it are
	// masqueraded on their way to a real server. Zero: DefaultMark.
	Mark uint32
	// NodeIPs are the addresses NodePorts are served on (one virtual
	// server per node IP and NodePort). Empty: every node address
	// (Links.NodeAddrs), found anew on each full sync.
	NodeIPs []netip.Addr
	// NodePortAddresses restricts the node IPs (given or found) to those
	// inside these prefixes. Empty: no restriction.
	NodePortAddresses []netip.Prefix
	// ExcludeCIDRs (kube-proxy's ipvs.excludeCIDRs) protect the virtual
	// servers of others on shared addresses, such as a keepalived's on a
	// node IP: a virtual server on an address inside one is neither pruned
	// by a sync nor removed by Cleanup unless this Mode created it (since
	// it started, or a previous run recorded in MadeFile). One its
	// Services ask for is made, or taken over, and kept as any other;
	// taken over, it is left as it is once they stop asking.
	ExcludeCIDRs []netip.Prefix
	// MadeFile, if set, is where the mode records the virtual servers it
	// made on excluded addresses, and reads them at each full sync and at
	// Cleanup: the next svcproxy (a restart, a handover, a DaemonSet
	// rollout's new pod) then deletes them when their Services go. Keep
	// it on a filesystem that lives as long as the kernel's IPVS table
	// (/run). "": not recorded; a restart leaves them for good, as
	// kube-proxy does.
	MadeFile string
	// Traffic to NodePorts, ExternalIPs and LoadBalancer IPs of Services
	// with the Cluster external traffic policy is masqueraded (and an
	// endpoint reaching itself through its Service); MasqueradeAll
	// masquerades all traffic to ClusterIPs too, from pods as well
	// (kube-proxy's --masquerade-all).
	MasqueradeAll bool
	// IPv6 also programs IPv6 frontends, ip6tables and the -v6 sets.
	IPv6 bool
	// DrainTimeout is the longest a removed TCP real server stays at
	// weight 0 waiting for its connections to end. Zero: no limit.
	DrainTimeout time.Duration
	// SweepInterval is how often the sweeper (started by the first Apply,
	// stopped by Close) looks for drained real servers. Zero: 5s.
	SweepInterval time.Duration
	// Timeouts are the network namespace's IPVS connection timeouts
	// (kube-proxy's ipvs.tcpTimeout, tcpFinTimeout and udpTimeout; the
	// kernel's defaults are 900s, 120s and 300s), in whole seconds (New
	// drops a fraction, and refuses what sysctl.CheckSeconds does). Each
	// full sync sets those that differ; zero leaves one as it is. Failing
	// to set them is a warning, not a failed sync, as in kube-proxy.
	Timeouts Timeouts
	// KernelRelease is the running kernel's (uname -r), which decides
	// whether conn_reuse_mode is set (see Parameters). "": read it (uname).
	KernelRelease string

	// The kernel boundaries. Nil: the real ones in this process's network
	// namespace (NewIPVS, NewLinks, &netfilter.Exec{}, conntrack.NewNetlink, sysctl.Files{}).
	IPVS      IPVS
	Links     Links
	Rules     Rules
	Conntrack Conntrack
	Sysctls   Sysctls

	Logger *zap.Logger      // nil: no logging
	Now    func() time.Time // nil: time.Now
}

// Mode is svcproxy's IPVS mode. Its methods are safe for concurrent use;
// calls are serialised.
type Mode struct {
	cfg      Config
	log      *zap.Logger
	families []Family

	mu    sync.Mutex
	ipvs  IPVS
	links Links
	rules Rules
	ct    *conntrack.Counting // Config.Conntrack, counted
	// staleUDP are the UDP flows of real servers this sync deleted, per
	// family, whose entries flushUDP deletes in one read of the table.
	staleUDP    [2][]conntrack.Match
	sysctls     Sysctls
	randomFully *bool // detected on the first full sync
	// timeoutsErr is the last failure to set Config.Timeouts, warned
	// about once.
	timeoutsErr string
	// cur is what the kernel holds, as far as this Mode knows: what the last
	// sync found and wrote. Nil before the first sync and after Cleanup.
	cur *state
	// made are the virtual servers this Mode created (rather than found
	// and took over) and has not deleted since: on an address
	// Config.ExcludeCIDRs protects, only these are its to delete.
	made map[vsKey]struct{}
	// madeSaved is the made file's content as last read or written
	// (madeFile: it exists); madeErr the last failure to read or write
	// it, warned about once; madeWarned: its bad lines were.
	madeSaved, madeErr   string
	madeFile, madeWarned bool
	// shortWarned: the short circuit's absence was logged (warnShortCircuit).
	shortWarned bool
	// needFull: a sync failed part-way; the next Apply reads the kernel.
	needFull bool
	repairs  atomic.Uint64
	draining atomic.Int64
	// rec writes the iptables rules and ipsets; ruleDiffs are the
	// differences its last full sync found.
	rec       *netfilter.Reconciler
	ruleDiffs []string
	sets      netfilter.MemberSets[member]

	// The sweeper: started by the first Apply, stopped by Close (after
	// which none starts).
	stopSweeper func()
	sweeperDone chan struct{}
	closed      bool
}

// state is the kernel state this Mode owns.
type state struct {
	nodeIPs []netip.Addr
	vips    map[netip.Addr]struct{}
	vs      map[vsKey]*vsState
}

type vsState struct {
	attrs vsAttrs
	dests map[netip.AddrPort]*destState
}

type destState struct {
	weight int
	// draining is when the real server was set to weight 0 to drain; zero
	// for a live one.
	draining time.Time
	// active+inactive connections, as last read from the kernel.
	conns int
}

func (s *vsState) hasDraining() bool {
	for _, d := range s.dests {
		if !d.draining.IsZero() {
			return true
		}
	}
	return false
}

// New validates cfg. It touches nothing in the kernel.
func New(cfg Config) (*Mode, error) {
	if cfg.Scheduler == "" {
		cfg.Scheduler = "rr"
	}
	if !slices.Contains(Schedulers, cfg.Scheduler) {
		return nil, fmt.Errorf("creating IPVS mode: unknown scheduler %q (want one of %s)", cfg.Scheduler, strings.Join(Schedulers, ", "))
	}
	if cfg.Mark == 0 {
		cfg.Mark = DefaultMark
	}
	for i, p := range cfg.NodePortAddresses {
		if !p.IsValid() {
			return nil, fmt.Errorf("creating IPVS mode: nodePortAddresses[%d]: invalid prefix", i)
		}
		cfg.NodePortAddresses[i] = p.Masked()
	}
	for i, p := range cfg.ExcludeCIDRs {
		if !p.IsValid() {
			return nil, fmt.Errorf("creating IPVS mode: excludeCIDRs[%d]: invalid prefix", i)
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96) // virtual servers' addresses are unmapped
		}
		cfg.ExcludeCIDRs[i] = p.Masked()
	}
	for i, ip := range cfg.NodeIPs {
		if !ip.IsValid() || ip.IsUnspecified() {
			return nil, fmt.Errorf("creating IPVS mode: nodeIPs[%d]: invalid address %v", i, ip)
		}
	}
	if cfg.DrainTimeout < 0 {
		return nil, errors.New("creating IPVS mode: negative drain timeout")
	}
	for _, t := range []struct {
		name string
		d    *time.Duration
	}{{"TCP", &cfg.Timeouts.TimeoutTCP}, {"TCP FIN", &cfg.Timeouts.TimeoutTCPFin}, {"UDP", &cfg.Timeouts.TimeoutUDP}} {
		if err := sysctl.CheckSeconds(*t.d); err != nil {
			return nil, fmt.Errorf("creating IPVS mode: %s timeout: %w", t.name, err)
		}
		*t.d = t.d.Truncate(time.Second) // the kernel counts whole seconds
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m := &Mode{
		cfg: cfg, log: cfg.Logger.Named("ipvs"), families: []Family{IPv4},
		ipvs: cfg.IPVS, links: cfg.Links, rules: cfg.Rules, sysctls: cfg.Sysctls,
	}
	if cfg.IPv6 {
		m.families = append(m.families, IPv6)
	}
	if cfg.Conntrack == nil {
		cfg.Conntrack = conntrack.NewNetlink("")
	}
	m.ct = &conntrack.Counting{Table: cfg.Conntrack}
	if m.rules == nil {
		m.rules = &netfilter.Exec{}
	}
	m.rec = netfilter.NewReconciler(netfilter.ReconcilerConfig{
		Tools: m.rules, ChainPrefix: chainPrefix, SetPrefix: setPrefix,
		Repaired: func(diffs []string) { m.ruleDiffs = diffs },
	})
	if m.sysctls == nil {
		m.sysctls = sysctl.Files{}
	}
	if m.cfg.KernelRelease == "" {
		m.cfg.KernelRelease = KernelRelease()
	}
	if _, ok := kernelVersion(m.cfg.KernelRelease); !ok {
		m.log.Warn("cannot read the kernel's version; conn_reuse_mode is left as it is", zap.String("release", m.cfg.KernelRelease))
	}
	return m, nil
}

// Repairs counts full syncs that found svcproxy's IPVS services, addresses,
// sets or rules differing from what it last left (someone tampered with
// them) and repaired them.
func (m *Mode) Repairs() uint64 { return m.repairs.Load() }

// RestoreFailures counts the iptables-restore runs of this mode's syncs
// that failed for family (kube-proxy's
// kubeproxy_sync_proxy_rules_iptables_restore_failures_total).
func (m *Mode) RestoreFailures(family Family) uint64 { return m.rec.RestoreFailures(family) }

// Draining is the number of real servers at weight 0 waiting for their
// connections to end.
func (m *Mode) Draining() int { return int(m.draining.Load()) }

// excluded says whether a is inside Config.ExcludeCIDRs.
func (m *Mode) excluded(a netip.Addr) bool {
	return slices.ContainsFunc(m.cfg.ExcludeCIDRs, func(p netip.Prefix) bool { return p.Contains(a) })
}

// foreign says whether the virtual server k is someone else's to leave
// alone: on an excluded address, not wanted (want may be nil), and not
// created by this Mode.
func (m *Mode) foreign(k vsKey, want map[vsKey]*vsWant) bool {
	if !m.excluded(k.addr.Addr()) || want[k] != nil {
		return false
	}
	_, mine := m.made[k]
	return !mine
}

// kernel returns the boundaries, creating the real ones on first use. The
// real IPVS handle needs IPVS: without it, ErrUnavailable.
func (m *Mode) kernel() error {
	if m.links == nil {
		l, err := NewLinks(netns.None())
		if err != nil {
			return err
		}
		m.links = l
	}
	if m.ipvs == nil {
		h, err := NewIPVS()
		if err != nil {
			return err
		}
		m.ipvs = h
	}
	return nil
}

// Apply makes the kernel serve snap's Services through IPVS. It is
// idempotent. Without full, it changes only what differs from what the last
// sync left, and makes no kernel call at all when nothing did (but for
// reading the connection counts of draining real servers). full (and the
// first Apply, and any after a failed one) reads the kernel, prunes
// whatever svcproxy owns but should not be there and repairs tampering.
// A Service that cannot be programmed does not stop the others: the error
// joins them all.
func (m *Mode) Apply(ctx context.Context, snap *lb.Snapshot, full bool) error {
	if snap == nil {
		return errors.New("applying IPVS services: nil snapshot")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.kernel(); err != nil {
		return fmt.Errorf("applying IPVS services: %w", err)
	}
	m.warnShortCircuit(snap)
	m.startSweeper()
	start := m.cfg.Now()
	full = full || m.cur == nil || m.needFull
	var err error
	var errs []error
	if full {
		var nodeIPs []netip.Addr
		nodeIPs, err = m.nodeIPs(ctx)
		if err == nil {
			want, cerrs := m.compute(snap, nodeIPs)
			errs = cerrs
			err = m.fullSync(ctx, want, nodeIPs)
		}
	} else {
		want, cerrs := m.compute(snap, m.cur.nodeIPs)
		errs = cerrs
		err = m.partialSync(ctx, want)
	}
	m.needFull = err != nil
	m.saveMade()
	if ferr := m.flushUDP(ctx); ferr != nil {
		errs = append(errs, ferr)
	}
	m.countDraining()
	took := m.cfg.Now().Sub(start)
	level := zap.DebugLevel
	if full && (took > time.Second || err != nil) {
		level = zap.InfoLevel
	}
	m.log.Log(level, "applied", zap.Bool("full", full), zap.Uint64("version", snap.Version),
		zap.Int("services", len(m.curVS())), zap.Duration("duration", took), zap.Error(err))
	return errors.Join(append(errs, err)...)
}

func (m *Mode) curVS() map[vsKey]*vsState {
	if m.cur == nil {
		return nil
	}
	return m.cur.vs
}

func (m *Mode) countDraining() {
	n := 0
	for _, s := range m.curVS() {
		for _, d := range s.dests {
			if !d.draining.IsZero() {
				n++
			}
		}
	}
	m.draining.Store(int64(n))
}

// nodeIPs are the addresses NodePorts are served on.
func (m *Mode) nodeIPs(ctx context.Context) ([]netip.Addr, error) {
	ips := m.cfg.NodeIPs
	if len(ips) == 0 {
		var err error
		if ips, err = m.links.NodeAddrs(ctx, DummyInterface); err != nil {
			return nil, fmt.Errorf("listing node addresses: %w", err)
		}
	}
	out := make([]netip.Addr, 0, len(ips))
	for _, ip := range ips {
		ip = ip.Unmap()
		if familyOf(ip) == IPv6 && !m.cfg.IPv6 {
			continue
		}
		if len(m.cfg.NodePortAddresses) > 0 && !slices.ContainsFunc(m.cfg.NodePortAddresses, func(p netip.Prefix) bool { return p.Contains(ip) }) {
			continue
		}
		if !slices.Contains(out, ip) {
			out = append(out, ip)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// partialSync writes what differs between m.cur and want.
func (m *Mode) partialSync(ctx context.Context, want *desired) error {
	cur := m.cur
	// Set members first: a new frontend is marked (or rejected) from its
	// first packet.
	rs := m.ruleset(want)
	if err := m.rec.Sync(ctx, rs, false); err != nil {
		m.sets.Written(nil)
		return err
	}
	m.sets.Written(rs)
	for _, vip := range sortedAddrs(want.vips) {
		if _, ok := cur.vips[vip]; ok {
			continue
		}
		if err := m.links.AddAddr(ctx, DummyInterface, vip); err != nil {
			return fmt.Errorf("adding %v to %s: %w", vip, DummyInterface, err)
		}
		cur.vips[vip] = struct{}{}
	}
	errs := m.reconcile(ctx, cur.vs, want.vs)
	errs = append(errs, m.reap(ctx, cur.vs, false))
	inUse := addrsOf(cur.vs) // a virtual server that failed to go keeps its VIP: it stays ours
	for _, vip := range sortedAddrs(cur.vips) {
		if _, ok := want.vips[vip]; ok || inUse[vip] {
			continue
		}
		if err := m.links.DelAddr(ctx, DummyInterface, vip); err != nil {
			errs = append(errs, fmt.Errorf("removing %v from %s: %w", vip, DummyInterface, err))
			continue
		}
		delete(cur.vips, vip)
	}
	return errors.Join(errs...)
}

// reconcile makes the virtual servers in have (the kernel's, as known) what
// want says, updating have as it goes. A real server that is no longer
// wanted drains: TCP ones get weight 0 until their connections end (reap
// deletes them), UDP ones are deleted at once and their conntrack entries
// cleared.
func (m *Mode) reconcile(ctx context.Context, have map[vsKey]*vsState, want map[vsKey]*vsWant) []error {
	var errs []error
	now := m.cfg.Now()
	for _, k := range slices.SortedFunc(maps.Keys(want), vsKey.Compare) {
		w := want[k]
		s := have[k]
		svc := toService(k, w.attrs)
		switch {
		case s == nil:
			s = &vsState{attrs: w.attrs, dests: make(map[netip.AddrPort]*destState, len(w.dests))}
			err := m.ipvs.NewService(svc)
			if err == nil {
				m.madeIt(k)
			} else if errors.Is(err, syscall.EEXIST) {
				// Someone else's: take it over, with the real servers
				// it has, which drain below as any that are not wanted.
				if err = m.ipvs.UpdateService(svc); err == nil {
					err = m.readDests(svc, s)
				}
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("creating virtual server %v (%v): %w", k, w.service, err))
				continue
			}
			m.log.Debug("virtual server created", zap.Stringer("service", w.service), zap.Stringer("frontend", k))
			have[k] = s
		case s.attrs != w.attrs:
			err := m.ipvs.UpdateService(svc)
			if errors.Is(err, syscall.ESRCH) {
				if err = m.ipvs.NewService(svc); err == nil {
					m.madeIt(k)
				}
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("updating virtual server %v (%v): %w", k, w.service, err))
				continue
			}
			s.attrs = w.attrs
		}
		for _, a := range w.dests {
			d := s.dests[a]
			if d != nil && d.weight == 1 {
				continue
			}
			dst := toDestination(a, 1)
			var err error
			if d == nil {
				if err = m.ipvs.NewDestination(svc, dst); errors.Is(err, syscall.EEXIST) {
					err = m.ipvs.UpdateDestination(svc, dst)
				}
			} else {
				if err = m.ipvs.UpdateDestination(svc, dst); errors.Is(err, syscall.ENOENT) {
					err = m.ipvs.NewDestination(svc, dst)
				}
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("adding real server %v to %v (%v): %w", a, k, w.service, err))
				continue
			}
			s.dests[a] = &destState{weight: 1}
		}
		for _, a := range sortedAddrPorts(s.dests) {
			d := s.dests[a]
			if slices.Contains(w.dests, a) || !d.draining.IsZero() {
				continue
			}
			if k.proto != lb.TCP {
				// UDP and SCTP real servers go at once, as kube-proxy
				// does: graceful termination is TCP's.
				if err := m.delDest(ctx, k, s, a); err != nil {
					errs = append(errs, fmt.Errorf("removing real server %v of %v (%v): %w", a, k, w.service, err))
				}
				continue
			}
			if d.weight != 0 {
				err := m.ipvs.UpdateDestination(svc, toDestination(a, 0))
				if errors.Is(err, syscall.ENOENT) {
					delete(s.dests, a)
					continue
				}
				if err != nil {
					errs = append(errs, fmt.Errorf("draining real server %v of %v (%v): %w", a, k, w.service, err))
					continue
				}
			}
			d.weight, d.draining = 0, now
			m.log.Debug("real server draining", zap.Stringer("service", w.service), zap.Stringer("frontend", k), zap.Stringer("backend", a))
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(have), vsKey.Compare) {
		if _, ok := want[k]; ok {
			continue
		}
		s := have[k]
		if m.foreign(k, want) {
			delete(have, k) // taken over once, someone else's again
			m.log.Debug("virtual server left on an excluded address", zap.Stringer("frontend", k))
			continue
		}
		if err := m.ipvs.DelService(toService(k, s.attrs)); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("deleting virtual server %v: %w", k, err))
			continue
		}
		delete(have, k)
		delete(m.made, k)
		m.log.Debug("virtual server deleted", zap.Stringer("frontend", k))
		if k.proto == lb.UDP {
			for _, a := range sortedAddrPorts(s.dests) {
				m.forgetUDP(k, a)
			}
		}
	}
	return errs
}

// madeIt records that this Mode created the virtual server k.
func (m *Mode) madeIt(k vsKey) {
	if m.made == nil {
		m.made = map[vsKey]struct{}{}
	}
	m.made[k] = struct{}{}
}

// readDests fills s.dests with the real servers the kernel has for svc.
func (m *Mode) readDests(svc *Service, s *vsState) error {
	ds, err := m.ipvs.GetDestinations(svc)
	if err != nil {
		return fmt.Errorf("listing real servers: %w", err)
	}
	for _, d := range ds {
		if a, ok := destAddr(d); ok {
			s.dests[a] = &destState{weight: d.Weight, conns: d.ActiveConnections + d.InactiveConnections}
		}
	}
	return nil
}

// delDest deletes a real server and, for UDP, its conntrack entries.
func (m *Mode) delDest(ctx context.Context, k vsKey, s *vsState, a netip.AddrPort) error {
	err := m.ipvs.DelDestination(toService(k, s.attrs), toDestination(a, 0))
	if err != nil && !errors.Is(err, syscall.ENOENT) {
		return err
	}
	delete(s.dests, a)
	if k.proto == lb.UDP {
		m.forgetUDP(k, a)
	}
	return nil
}

// reap deletes the draining real servers whose connections have ended (or
// whose DrainTimeout passed). It reads the connection counts of virtual
// servers with draining real servers, unless fresh says a full sync just
// read them all.
func (m *Mode) reap(ctx context.Context, have map[vsKey]*vsState, fresh bool) error {
	var errs []error
	now := m.cfg.Now()
	for _, k := range slices.SortedFunc(maps.Keys(have), vsKey.Compare) {
		s := have[k]
		if !s.hasDraining() {
			continue
		}
		if !fresh {
			got, err := m.ipvs.GetDestinations(toService(k, s.attrs))
			if err != nil {
				errs = append(errs, fmt.Errorf("reading real servers of %v: %w", k, err))
				continue
			}
			seen := map[netip.AddrPort]bool{}
			for _, g := range got {
				if a, ok := destAddr(g); ok {
					seen[a] = true
					if d := s.dests[a]; d != nil {
						d.conns = g.ActiveConnections + g.InactiveConnections
					}
				}
			}
			for a, d := range s.dests {
				if !d.draining.IsZero() && !seen[a] {
					delete(s.dests, a) // gone already
				}
			}
		}
		for _, a := range sortedAddrPorts(s.dests) {
			d := s.dests[a]
			conns := d.conns
			if d.draining.IsZero() {
				continue
			}
			expired := m.cfg.DrainTimeout > 0 && now.Sub(d.draining) >= m.cfg.DrainTimeout
			if conns != 0 && !expired {
				continue
			}
			if err := m.delDest(ctx, k, s, a); err != nil {
				errs = append(errs, fmt.Errorf("deleting drained real server %v of %v: %w", a, k, err))
				continue
			}
			m.log.Debug("drained real server deleted", zap.Stringer("frontend", k), zap.Stringer("backend", a),
				zap.Int("connections", conns), zap.Duration("drained", now.Sub(d.draining)))
		}
	}
	return errors.Join(errs...)
}

// Sweep deletes the draining real servers whose connections have ended. It
// makes no kernel call when none is draining.
func (m *Mode) Sweep(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cur == nil || m.ipvs == nil {
		return nil
	}
	err := m.reap(ctx, m.cur.vs, false)
	m.countDraining()
	if err != nil {
		m.needFull = true
	}
	return errors.Join(err, m.flushUDP(ctx))
}

// startSweeper starts the sweeper, once and not after Close. m.mu is held.
func (m *Mode) startSweeper() {
	if m.stopSweeper != nil || m.closed {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.stopSweeper, m.sweeperDone = cancel, make(chan struct{})
	go func() {
		defer close(m.sweeperDone)
		m.runSweeper(ctx)
	}()
}

// Close stops the sweeper. The IPVS services, addresses and rules stay, as
// kube-proxy leaves them: Services keep working while svcproxy restarts,
// and the next svcproxy takes them over with its first full sync
// (handedOver or not).
func (m *Mode) Close(ctx context.Context, handedOver bool) error {
	m.mu.Lock()
	m.closed = true
	stop, done := m.stopSweeper, m.sweeperDone
	m.mu.Unlock()
	if stop == nil {
		return nil
	}
	stop()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stopping the IPVS sweeper: %w", ctx.Err())
	}
}

// Available reports why this node cannot run the IPVS mode, or nil: the
// kernel must have IPVS (the package's Available) unless Config.IPVS
// brings its own handle.
func (m *Mode) Available(ctx context.Context) error {
	if m.cfg.IPVS != nil {
		return nil
	}
	return Available()
}

// runSweeper calls Sweep every Config.SweepInterval until ctx ends, logging
// failures.
func (m *Mode) runSweeper(ctx context.Context) {
	t := time.NewTicker(m.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := m.Sweep(ctx); err != nil {
				m.log.Warn("sweeping drained real servers", zap.Error(err))
			}
		}
	}
}

// Parameters are the kernel parameters this mode needs on a kernel of release
// (uname -r), as name and value; kube-proxy's IPVS mode sets the same:
//   - vs/conntrack, so iptables can masquerade IPVS traffic and clear UDP
//     entries;
//   - vs/expire_nodest_conn and vs/expire_quiescent_template, so
//     connections to a deleted (or persistence to a weight-0) real server
//     end at their next packet instead of hanging;
//   - ip_forward, so NodePort and external traffic reaches endpoints on
//     other nodes;
//   - on kernels 4.1 to 5.8 only, vs/conn_reuse_mode=0: there the default
//     (1) makes a SYN that reuses the port of an IPVS connection in
//     TIME_WAIT wait a second (kubernetes/kubernetes#81775); 5.9 fixed it,
//     and kube-proxy leaves it alone there too.
func Parameters(release string) [][2]string {
	s := [][2]string{
		{"net/ipv4/vs/conntrack", "1"},
		{"net/ipv4/vs/expire_nodest_conn", "1"},
		{"net/ipv4/vs/expire_quiescent_template", "1"},
		{"net/ipv4/ip_forward", "1"},
	}
	if v, ok := kernelVersion(release); ok && v >= 4_001 && v < 5_009 {
		s = append(s, [2]string{"net/ipv4/vs/conn_reuse_mode", "0"})
	}
	return s
}

// kernelVersion is a kernel release's major and minor number as
// major*1000+minor ("5.4.0-150-generic": 5_004).
func kernelVersion(release string) (int, bool) {
	major, rest, ok := strings.Cut(release, ".")
	if !ok {
		return 0, false
	}
	minor := rest
	if i := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minor = rest[:i]
	}
	a, err1 := strconv.Atoi(major)
	b, err2 := strconv.Atoi(minor)
	return a*1000 + b, err1 == nil && err2 == nil && b < 1000
}

func (m *Mode) ensureSysctls() error {
	set, err := EnsureSysctls(m.sysctls, m.cfg.KernelRelease)
	for _, p := range set {
		m.log.Info("set a kernel parameter the IPVS mode needs", zap.String("parameter", p))
	}
	return err
}

// ensureTimeouts sets the IPVS timeouts Config.Timeouts names where they
// differ, and warns (once for the same failure) when it cannot.
func (m *Mode) ensureTimeouts() {
	want := m.cfg.Timeouts
	if want == (Timeouts{}) {
		return
	}
	err := m.setTimeouts(want)
	msg := ""
	if err != nil {
		msg = err.Error()
		if msg != m.timeoutsErr {
			m.log.Warn("IPVS timeouts left as they are", zap.Error(err))
		}
	}
	m.timeoutsErr = msg
}

func (m *Mode) setTimeouts(want Timeouts) error {
	have, err := m.ipvs.GetConfig()
	if err != nil {
		return fmt.Errorf("reading IPVS timeouts: %w", err)
	}
	var set Timeouts
	var changed []zap.Field
	for _, t := range []struct {
		name       string
		want, have time.Duration
		set        *time.Duration
	}{
		{"tcp", want.TimeoutTCP, have.TimeoutTCP, &set.TimeoutTCP},
		{"tcp_fin", want.TimeoutTCPFin, have.TimeoutTCPFin, &set.TimeoutTCPFin},
		{"udp", want.TimeoutUDP, have.TimeoutUDP, &set.TimeoutUDP},
	} {
		if t.want != 0 && t.want != t.have {
			*t.set = t.want
			changed = append(changed, zap.String(t.name, fmt.Sprintf("%v -> %v", t.have, t.want)))
		}
	}
	if len(changed) == 0 {
		return nil
	}
	if err := m.ipvs.SetConfig(&set); err != nil {
		return fmt.Errorf("setting IPVS timeouts: %w", err)
	}
	m.log.Info("set IPVS timeouts", changed...)
	return nil
}

// EnsureSysctls sets the parameters this mode needs on a kernel of
// release (Parameters) where they differ: what the mode does at each full
// sync, and svcproxy --init-only (with the privileges to write /proc/sys)
// before it starts. It returns those it changed, as name=value (was old).
func EnsureSysctls(p Sysctls, release string) (set []string, err error) {
	var errs []error
	for _, s := range Parameters(release) {
		old, wrote, err := sysctl.Ensure(p, s[0], s[1], nil)
		if err != nil {
			errs = append(errs, err)
		} else if wrote {
			set = append(set, fmt.Sprintf("%s=%s (was %s)", s[0], s[1], old))
		}
	}
	return set, errors.Join(errs...)
}

var iptablesVersionRE = regexp.MustCompile(`v(\d+)\.(\d+)\.(\d+)`)

// detectRandomFully reports whether iptables supports MASQUERADE
// --random-fully (1.6.2 and later; the kernel has had it since 3.13).
func (m *Mode) detectRandomFully(ctx context.Context) bool {
	v, err := m.rules.IPTablesVersion(ctx)
	if err != nil {
		m.log.Warn("reading the iptables version; not using --random-fully", zap.Error(err))
		return false
	}
	g := iptablesVersionRE.FindStringSubmatch(v)
	if g == nil {
		return false
	}
	n := [3]int{}
	for i := range n {
		n[i], _ = strconv.Atoi(g[i+1])
	}
	ok := n[0] > 1 || (n[0] == 1 && (n[1] > 6 || (n[1] == 6 && n[2] >= 2)))
	m.log.Info("iptables detected", zap.String("version", v), zap.Bool("random_fully", ok))
	return ok
}

func addrsOf(vs map[vsKey]*vsState) map[netip.Addr]bool {
	out := make(map[netip.Addr]bool, len(vs))
	for k := range vs {
		out[k.addr.Addr()] = true
	}
	return out
}

func sortedAddrs(s map[netip.Addr]struct{}) []netip.Addr {
	return slices.SortedFunc(maps.Keys(s), netip.Addr.Compare)
}

func sortedAddrPorts[V any](s map[netip.AddrPort]V) []netip.AddrPort {
	return slices.SortedFunc(maps.Keys(s), netip.AddrPort.Compare)
}

// warnShortCircuit warns, once, when snap has a Service whose clients
// inside the cluster kube-proxy's iptables and nftables modes would
// short-circuit to other endpoints than this node's (lb.Balancer.ShortCircuit):
// a virtual server serves every client alike, so the ipvs mode, like
// kube-proxy's, gives them this node's endpoints (all endpoints only when
// this node has none: see compute).
func (m *Mode) warnShortCircuit(snap *lb.Snapshot) {
	if m.shortWarned {
		return
	}
	if n, first := snap.ShortCircuits(); n > 0 {
		m.shortWarned = true
		m.log.Warn("pods and the node reaching an external address of a Service with externalTrafficPolicy Local and endpoints on this node get only those in the ipvs mode (as in kube-proxy's), not every endpoint as the other modes (and kube-proxy's iptables and nftables modes) give them",
			zap.Int("services", n), zap.Stringer("example", first))
	}
}
