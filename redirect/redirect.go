package redirect

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/redirect/steertable"
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
	// after steering (read with IP_PKTINFO / IPV6_RECVPKTINFO, sent with
	// it): the node address of Config.NodeIPs, or after REDIRECT 127.0.0.1
	// (::1) for clients on the node and the incoming interface's address
	// for the others. Only then does conntrack match
	// the reply and rewrite its source to the VIP:port the client sent to;
	// a socket bound to 0.0.0.0 that lets the kernel pick the source
	// answers node-local clients from the node's address, and a connected
	// client (a DNS resolver) drops that.
	UDP map[lb.Frontend]uint16
}

// Backend names what writes the steering rules.
type Backend string

const (
	// BackendAuto is nftables when the kernel takes the steering table
	// (a throwaway copy is written and deleted at start), else iptables +
	// ipset. The zero Backend means it too.
	BackendAuto Backend = "auto"
	// BackendNFTables is one owned nftables table per family (Table),
	// written over netlink: no iptables, ipset or nft binary needed.
	BackendNFTables Backend = "nftables"
	// BackendIPTables is iptables (either backend) with ipsets.
	BackendIPTables Backend = "iptables"
)

// ParseBackend reads a --steering-backend value ("" is auto).
func ParseBackend(s string) (Backend, error) {
	switch b := Backend(s); b {
	case "", BackendAuto:
		return BackendAuto, nil
	case BackendNFTables, BackendIPTables:
		return b, nil
	}
	return "", fmt.Errorf("want auto, nftables or iptables, got %q", s)
}

// Config configures a Redirector.
type Config struct {
	// Backend chooses what writes the rules; empty: BackendAuto.
	Backend Backend
	// NetNS is the named network namespace (ip netns) the nftables backend
	// programs; empty: this process's. The iptables backend runs Exec,
	// which has its own.
	NetNS string
	// Mark is the SO_MARK of the forwarder's upstream sockets; packets
	// carrying it (mask Mark) are never redirected or rejected. Required.
	Mark uint32
	// NodePortAddresses restricts NodePorts to the node's addresses inside
	// these prefixes. Empty: every local address (addrtype LOCAL). A /0 of a
	// family lifts the restriction for that family; a family with no prefix
	// gets no NodePorts.
	NodePortAddresses []netip.Prefix
	// ClusterCIDRs are the pods' addresses (--cluster-cidr). A frontend of
	// an externalTrafficPolicy Local Service with no endpoint on this node
	// but some elsewhere (its short circuit, lb.Pool.ShortCircuit) is
	// steered for clients inside these and for the node itself, and
	// rejected for everyone else, as a frontend without endpoints is.
	// Empty: only the node is inside.
	ClusterCIDRs []netip.Prefix
	// netfilter.IPv6 also programs ip6tables and the -v6 sets.
	IPv6 bool
	// NodeIPs are addresses of the node, at most one per family, that
	// steered traffic is sent to: a family with one DNATs to it (and the
	// forwarder's port), a family without one REDIRECTs. REDIRECT sends a
	// packet that arrives from another host or a pod to the first address
	// of the interface it came in on, and drops it when that interface has
	// none of the family (the kernel's nf_nat_redirect): pods' veths on
	// Calico and Cilium are unnumbered (a link-local gateway with proxy
	// ARP), so every pod's Service traffic would be lost. The forwarder
	// listens on every address, so any address of the node will do; the
	// caller makes sure each is one (a DNAT to an address that is not
	// local would send Service traffic out of the node).
	NodeIPs []netip.Addr
	// Exec runs the kernel tools: iptables and ipset for the iptables
	// backend; the nftables backend only to remove what that one left.
	// Nil: netfilter.NewExec(NetNS) (the real tools).
	Exec netfilter.Executor
	// NFT writes the nftables backend's tables. Nil:
	// steertable.Netlink(NetNS).
	NFT steertable.Kernel
	// Conntrack clears the entries of packets that reached a frontend
	// before it was steered (see clearUnsteered), and of UDP frontends
	// steered elsewhere since (forgetMoved). Nil:
	// conntrack.NewNetlink(NetNS).
	Conntrack conntrack.Table
	// Logger; nil: no logging.
	Logger *zap.Logger
}

// Redirector owns svcproxy's steering rules and sets. Its methods are safe
// for concurrent use; calls are serialised.
type Redirector struct {
	cfg          Config
	exec         netfilter.Executor
	log          *zap.Logger
	kind         Backend
	backend      string // the iptables backend, "" with nftables
	families     []netfilter.Family
	npRestricted [2]bool
	npAddrs      [2][]netip.Prefix
	// inside is, per family, Config.ClusterCIDRs.
	inside [2][]netip.Prefix
	// to is, per family, the node address steering DNATs to; invalid:
	// REDIRECT (Config.NodeIPs).
	to [2]netip.Addr

	rec *netfilter.Reconciler // the iptables backend

	nk          steertable.Kernel // the nftables backend
	nftFailures [2]atomic.Uint64
	nftRepairs  atomic.Uint64

	mu sync.Mutex
	// cur is what the last successful sync wrote; nil when this process
	// wrote nothing yet or a sync failed (the next Apply is a full one).
	cur   *desired
	spare map[member]struct{} // an emptied members map for the next compute
	sets  netfilter.MemberSets[member]
	// steered is the port each UDP frontend is known to be redirected to:
	// read from the kernel by the first Apply (what a previous process
	// left), then what each successful sync wrote.
	steered map[lb.Frontend]uint16
	// ncur is what the nftables backend's last successful sync wrote; nil
	// as cur.
	ncur *nftState
	// othersGone: the other backend's leftovers were removed.
	othersGone bool
	// started: the first Apply began (removeUnserved ran).
	started bool
	ct      *conntrack.Counting // cfg.Conntrack, counted
	served  conntrack.Served
	// servedPorts are the forwarder ports served was last brought up to
	// date with.
	servedPorts Ports
}

// New validates cfg and chooses the backend: with BackendAuto, nftables
// when a throwaway copy of the steering table can be written (in each
// family served), else iptables, whose backend (nf_tables or legacy) it
// detects.
func New(cfg Config) (*Redirector, error) {
	if cfg.Mark == 0 {
		return nil, errors.New("creating redirector: mark must not be zero")
	}
	kind, err := ParseBackend(string(cfg.Backend))
	if err != nil {
		return nil, fmt.Errorf("creating redirector: backend: %w", err)
	}
	if cfg.Exec == nil {
		cfg.Exec = netfilter.NewExec(cfg.NetNS)
	}
	if cfg.NFT == nil {
		cfg.NFT = steertable.Netlink(cfg.NetNS)
	}
	if cfg.Conntrack == nil {
		cfg.Conntrack = conntrack.NewNetlink(cfg.NetNS)
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	r := &Redirector{cfg: cfg, exec: cfg.Exec, nk: cfg.NFT, ct: &conntrack.Counting{Table: cfg.Conntrack}, log: cfg.Logger.Named("redirect"), families: []netfilter.Family{netfilter.IPv4}}
	if cfg.IPv6 {
		r.families = append(r.families, netfilter.IPv6)
	}
	r.rec = netfilter.NewReconciler(netfilter.ReconcilerConfig{
		Tools: cfg.Exec, ChainPrefix: chainPrefix, SetPrefix: setPrefix,
		Repaired: func(diffs []string) {
			r.served.Reset() // meanwhile packets met no rule: every frontend's entries are suspect
			r.log.Warn("rules or sets were changed behind svcproxy's back; repairing",
				zap.Strings("differences", diffs[:min(len(diffs), 10)]), zap.Int("count", len(diffs)))
		},
	})
	if r.npRestricted, r.npAddrs, err = netfilter.NodePortPrefixes(cfg.NodePortAddresses); err != nil {
		return nil, fmt.Errorf("creating redirector: %w", err)
	}
	for _, p := range cfg.ClusterCIDRs {
		if !p.IsValid() {
			return nil, fmt.Errorf("creating redirector: cluster CIDR %v is not a prefix", p)
		}
		p = netfilter.UnmapPrefix(p)
		fam := netfilter.FamilyOf(p.Addr())
		if p.Bits() == 0 { // ipset's hash:net holds no /0: its two halves
			lo, hi := p.Addr().AsSlice(), p.Addr().AsSlice()
			hi[0] = 0x80
			a, _ := netip.AddrFromSlice(lo)
			b, _ := netip.AddrFromSlice(hi)
			r.inside[fam] = append(r.inside[fam], netip.PrefixFrom(a, 1), netip.PrefixFrom(b, 1))
			continue
		}
		r.inside[fam] = append(r.inside[fam], p)
	}
	if r.to, err = steerAddrs(cfg.NodeIPs); err != nil {
		return nil, fmt.Errorf("creating redirector: node IPs: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var nftErr error
	if kind != BackendIPTables {
		nftErr = r.probeNFT(ctx)
		switch {
		case nftErr == nil:
			r.kind = BackendNFTables
		case kind == BackendNFTables:
			return nil, fmt.Errorf("creating redirector: nftables backend: %w", nftErr)
		}
	}
	v, err := r.exec.IPTablesVersion(ctx)
	switch {
	case err != nil && r.kind == BackendNFTables:
		// No iptables: nothing of the iptables backend to remove either.
	case err != nil:
		if nftErr != nil {
			err = errors.Join(err, fmt.Errorf("nftables: %w", nftErr))
		}
		return nil, fmt.Errorf("detecting iptables backend: %w", err)
	case strings.Contains(v, "nf_tables"):
		r.backend = "nf_tables"
	default:
		// iptables before 1.8 only had the legacy backend and did not say so.
		r.backend = "legacy"
	}
	if r.kind == "" {
		r.kind = BackendIPTables
		if nftErr != nil {
			r.log.Info("steering with iptables: nftables is not usable here", zap.Error(nftErr))
		}
		r.log.Info("iptables backend detected", zap.String("backend", r.backend), zap.String("version", v))
	}
	return r, nil
}

// steerAddrs reads Config.NodeIPs into one address per family.
func steerAddrs(ips []netip.Addr) (to [2]netip.Addr, err error) {
	for _, a := range ips {
		a = a.Unmap()
		switch {
		case !a.IsValid(), a.IsUnspecified(), a.IsMulticast(), a.IsLinkLocalUnicast(), a.Zone() != "":
			return to, fmt.Errorf("%v: not a node address to steer to", a)
		case a.IsLoopback():
			// Traffic from other hosts DNATed to loopback is dropped as
			// martian (without route_localnet).
			return to, fmt.Errorf("%v: a loopback address cannot receive traffic from other hosts", a)
		}
		fam := familyOf(a)
		if to[fam].IsValid() && to[fam] != a {
			return to, fmt.Errorf("%v and %v: one address per family", to[fam], a)
		}
		to[fam] = a
	}
	return to, nil
}

// probeNFT writes and deletes a throwaway steering table in each family.
func (r *Redirector) probeNFT(ctx context.Context) error {
	for _, fam := range r.families {
		if err := r.nk.Probe(ctx, r.layout(fam)); err != nil {
			return err
		}
	}
	return nil
}

// Available reports which backend cfg would steer with on this node, or
// why it cannot steer: New's choice, without keeping anything.
func Available(ctx context.Context, cfg Config) (Backend, error) {
	if cfg.Mark == 0 {
		cfg.Mark = 1
	}
	r, err := New(cfg)
	if err != nil {
		return "", err
	}
	if c, ok := r.nk.(io.Closer); ok && cfg.NFT == nil {
		_ = c.Close() // the probe's socket
	}
	return r.kind, nil
}

// Backend is what writes the rules: BackendNFTables or BackendIPTables.
func (r *Redirector) Backend() Backend { return r.kind }

// IPTables is the iptables backend in use, "nf_tables" or "legacy"; ""
// when the rules are written with nftables.
func (r *Redirector) IPTables() string { return r.backend }

// Describe says what steers, for logs: "nftables (table svcproxy-steering)"
// or "iptables (nf_tables) + ipset".
func (r *Redirector) Describe() string {
	if r.kind == BackendNFTables {
		return "nftables (table " + Table + ")"
	}
	return "iptables (" + r.backend + ") + ipset"
}

// SyncFailures counts the failed nftables transactions of this
// Redirector's syncs for family (kube-proxy's
// kubeproxy_sync_proxy_rules_nftables_sync_failures_total); always 0 with
// the iptables backend, whose failures are RestoreFailures.
func (r *Redirector) SyncFailures(family netfilter.Family) uint64 {
	return r.nftFailures[family].Load()
}

// Repairs counts full syncs that found the rules or sets differing from what
// this Redirector last wrote (someone tampered with them) and rewrote them.
func (r *Redirector) Repairs() uint64 { return r.rec.Repairs() + r.nftRepairs.Load() }

// RestoreFailures counts the iptables-restore runs of this Redirector's syncs
// that failed for family (kube-proxy's
// kubeproxy_sync_proxy_rules_iptables_restore_failures_total).
func (r *Redirector) RestoreFailures(family netfilter.Family) uint64 {
	return r.rec.RestoreFailures(family)
}

// wantedSets are the sets this configuration uses, by setID (the others
// have no Name).
func (r *Redirector) wantedSets() []netfilter.SetDef {
	defs := make([]netfilter.SetDef, numSets)
	for id, d := range setDefs {
		switch setID(id) {
		case setSvc6, setReject6, setNPAddrs6, setShort6, setInside6:
			if !r.cfg.IPv6 {
				continue
			}
		}
		switch setID(id) {
		case setNPAddrs4, setNPAddrs6:
			if !r.npRestricted[d.Family] {
				continue
			}
		}
		defs[id] = d
	}
	return defs
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
	if r.steered == nil { // nothing written or read yet
		steered, err := r.readSteered(ctx)
		if err != nil {
			r.log.Debug("cannot read what UDP frontends are steered to", zap.Error(err))
		}
		r.steered = steered
	}
	if !r.started {
		r.started = true
		r.removeUnserved(ctx)
		for _, fam := range r.families {
			if !r.to[fam].IsValid() {
				r.log.Warn("steering with REDIRECT: no node address to DNAT to in this family (Config.NodeIPs), and REDIRECT drops pod traffic arriving on an interface without an address of the family, as Calico's and Cilium's pod veths are", zap.Stringer("family", fam))
			}
		}
	}
	if r.kind == BackendNFTables {
		return r.applyNFT(ctx, snap, ports, full)
	}
	want, errs := r.compute(snap, ports, r.spare)
	r.spare = nil
	rs := r.ruleset(want)
	full = full || r.cur == nil
	err := r.rec.Sync(ctx, rs, full)
	if err != nil && !full {
		r.log.Warn("incremental sync failed; doing a full one", zap.Error(err))
		full = true
		err = r.rec.Sync(ctx, rs, true)
	}
	old := r.cur
	if err != nil {
		r.cur = nil
		r.sets.Written(nil)
	} else {
		r.cur = want
		r.sets.Written(rs)
		if full && !r.othersGone {
			// Only now that these rules steer: removing the other
			// backend's first would leave a moment with neither.
			r.removeNFT(ctx)
		}
		r.forgetMoved(ctx, want.udp)
		r.clearUnsteered(ctx, snap, ports)
	}
	// Reusing the old members map saves the garbage collector a
	// 10,000-entry map per Apply; but not one sized for far more than
	// wanted now (a map never shrinks), so that memory goes back after a
	// large configuration shrinks.
	if old != nil && old != r.cur && len(old.members) <= 2*len(want.members)+1024 {
		clear(old.members)
		r.spare = old.members
	}
	level := zap.DebugLevel
	if took := time.Since(start); full && (old == nil || took > time.Second) {
		level = zap.InfoLevel // the first full sync, the one after a failure, or a slow one
	}
	r.log.Log(level, "applied", zap.Bool("full", full), zap.Uint64("version", snap.Version),
		zap.Int("members", len(want.members)), zap.Duration("duration", time.Since(start)), zap.Error(err))
	return errors.Join(append(errs, err)...)
}

// removeUnserved removes what this backend wrote in
// IPv6 when IPv6 is not served now (switched off since a previous process
// wrote it): frozen, those rules would go on steering IPv6 Service traffic
// to ports nobody serves, or dropping datagrams to old UDP socket ports,
// until a --cleanup. The other backend's leftovers go in both families
// anyway (removeIPTables, removeNFT). The first Apply calls it; a failure
// is logged and not retried: a node without ip6tables has nothing there.
func (r *Redirector) removeUnserved(ctx context.Context) {
	if r.cfg.IPv6 {
		return
	}
	if r.kind == BackendNFTables {
		if err := r.nk.Delete(ctx, netfilter.IPv6); err != nil {
			r.log.Debug("removing the IPv6 steering table of an earlier run (IPv6 is not served now)", zap.Error(err))
		}
		return
	}
	if err := netfilter.RemoveOwned(ctx, r.exec, netfilter.IPv6, chainPrefix); err != nil {
		r.log.Debug("removing IPv6 steering rules of an earlier run (IPv6 is not served now)", zap.Error(err))
		return
	}
	for _, d := range setDefs {
		if d.Type != typePort && d.Family == netfilter.IPv6 {
			if err := netfilter.DestroySet(ctx, r.exec, d.Name); err != nil {
				r.log.Warn("removing an IPv6 steering set of an earlier run (IPv6 is not served now)", zap.String("set", d.Name), zap.Error(err))
			}
		}
	}
}

// ruleset is want as the Reconciler takes it.
func (r *Redirector) ruleset(want *desired) *netfilter.Ruleset {
	rs := netfilter.NewRuleset(r.families...)
	for _, fam := range r.families {
		rs.Chains[fam] = want.rules[fam]
		rs.Entries[fam] = ourJumps
	}
	r.sets.Fill(rs, r.wantedSets(), want.members, func(m member) int { return int(m.set) })
	return rs
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
	r.cur, r.ncur = nil, nil
	r.steered = nil
	r.rec.Forget()
	r.served.Reset()
	var errs []error
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		if err := r.nk.Delete(ctx, fam); err != nil && r.kind == BackendNFTables && (fam == netfilter.IPv4 || r.cfg.IPv6) {
			errs = append(errs, fmt.Errorf("removing the %v steering table: %w", fam, err))
		}
	}
	if r.backend != "" { // iptables is there
		if err := netfilter.Cleanup(ctx, r.exec, chainPrefix, setPrefix, r.cfg.IPv6); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// SteeredUDP reads from the kernel the port each UDP frontend is
// redirected to now (a UDP NodePort keyed by its family's unspecified
// address): what a previous svcproxy left, one that crashed or was stopped
// without removing its rules. A forwarder that binds its UDP sockets to the
// same ports keeps serving the flows conntrack still redirects there.
// Read before the first Apply, it is also what that Apply compares with,
// so the rules are read once.
func (r *Redirector) SteeredUDP(ctx context.Context) (map[lb.Frontend]uint16, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out, err := r.readSteered(ctx)
	if err == nil && r.steered == nil {
		r.steered = maps.Clone(out)
	}
	return out, err
}

// readSteered is SteeredUDP's read. Until the other backend's leftovers
// are removed (a node switching backends), what they steer counts too
// where this backend's rules say nothing: the forwarder then binds the
// same ports, and the conntrack entries of steady UDP flows, which keep
// sending them there, stay served (or, if the ports change after all,
// forgetMoved deletes them). Called with r.mu held.
func (r *Redirector) readSteered(ctx context.Context) (map[lb.Frontend]uint16, error) {
	read, other := r.readSteeredIPTables, r.readSteeredNFT
	if r.kind == BackendNFTables {
		read, other = other, read
	}
	out, err := read(ctx)
	if !r.othersGone {
		left, lerr := other(ctx)
		if lerr != nil {
			r.log.Debug("cannot read what the other steering backend steers UDP frontends to", zap.Error(lerr))
		}
		for fe, to := range left {
			if _, ok := out[fe]; !ok {
				out[fe] = to
			}
		}
	}
	return out, err
}

// readSteeredIPTables is readSteered for the iptables backend.
func (r *Redirector) readSteeredIPTables(ctx context.Context) (map[lb.Frontend]uint16, error) {
	out := map[lb.Frontend]uint16{}
	for _, fam := range r.families {
		save, err := r.exec.IPTablesSaveChains(ctx, fam, "nat", []string{chainUDP, chainNPUDP})
		if err != nil {
			return out, fmt.Errorf("reading UDP steering rules: %w", err)
		}
		maps.Copy(out, parseSteered(fam, save))
	}
	return out, nil
}

// parseSteered reads the REDIRECT and DNAT rules of SVCPROXY-UDP and
// SVCPROXY-NP-UDP in iptables-save output (a DNAT's address is the node's,
// only its port matters); other lines are skipped.
func parseSteered(fam netfilter.Family, save []byte) map[lb.Frontend]uint16 {
	out := map[lb.Frontend]uint16{}
	for line := range strings.Lines(string(save)) {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "-A" || (f[1] != chainUDP && f[1] != chainNPUDP) {
			continue
		}
		var dst netip.Addr
		var port, to uint64
		redirect, bad := false, false
		for i := 2; i+1 < len(f); i++ {
			var err error
			switch f[i] {
			case "-d":
				var p netip.Prefix
				if p, err = netip.ParsePrefix(f[i+1]); err == nil && p.IsSingleIP() {
					dst = p.Addr()
				}
			case "--dport":
				port, err = strconv.ParseUint(f[i+1], 10, 16)
			case "--to-ports":
				to, err = strconv.ParseUint(f[i+1], 10, 16)
			case "--to-destination":
				var ap netip.AddrPort
				if ap, err = netip.ParseAddrPort(f[i+1]); err == nil {
					to = uint64(ap.Port())
				}
			case "-j":
				redirect = f[i+1] == "REDIRECT" || f[i+1] == "DNAT"
			default:
				continue
			}
			bad = bad || err != nil
			i++
		}
		if f[1] == chainNPUDP {
			dst = unspecified(fam)
		}
		if !redirect || bad || port == 0 || to == 0 || !dst.IsValid() || familyOf(dst) != fam {
			continue
		}
		out[lb.Frontend{Protocol: lb.UDP, Addr: netip.AddrPortFrom(dst, uint16(port))}] = uint16(to)
	}
	return out
}

// forgetMoved deletes the conntrack entries of UDP frontends no longer
// redirected to the port they were (moved or removed): conntrack would
// keep sending those flows' datagrams to a port that is closed now, or
// that another frontend's socket reuses. kube-proxy clears UDP entries for
// the same reason. One read of the table per family with such frontends.
// Called with r.mu held, after a successful sync.
func (r *Redirector) forgetMoved(ctx context.Context, now map[lb.Frontend]uint16) {
	var moved [2][]conntrack.Match
	for fe, to := range r.steered {
		if now[fe] != to {
			fam, dst := familyOf(fe.Addr.Addr()), fe.Addr
			if dst.Addr().IsUnspecified() { // a NodePort: at every address
				dst = netip.AddrPortFrom(netip.Addr{}, dst.Port())
			}
			moved[fam] = append(moved[fam], conntrack.Match{Proto: lb.UDP, OrigDst: dst})
		}
	}
	if err := conntrack.DeleteMatchingByFamily(ctx, r.ct, moved); err != nil {
		r.log.Warn("clearing conntrack entries of moved UDP frontends", zap.Error(err))
	}
	r.steered = maps.Clone(now)
}
