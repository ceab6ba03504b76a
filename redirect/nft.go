package redirect

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/nftable"
	"github.com/svcproxy/svcproxy/redirect/steertable"
)

// Table is the nftables backend's table in each family.
const Table = steertable.Table

// elemKey names one element of a family's steering table.
type elemKey struct{ set, key string }

// layout is fam's steering table beyond its elements.
func (r *Redirector) layout(fam netfilter.Family) steertable.Layout {
	l := steertable.Layout{Family: fam, Mark: r.cfg.Mark, NodePorts: true, To: r.to[fam], ClusterCIDRs: r.inside[fam]}
	if r.npRestricted[fam] {
		l.NodePortPrefixes = r.npAddrs[fam]
		l.NodePorts = len(l.NodePortPrefixes) > 0
	}
	return l
}

// nftState is everything the nftables backend's last Apply left in the
// kernel, and per Service port what it contributed, so an incremental Apply
// rewrites only the Service ports the snapshot says changed.
type nftState struct {
	snap  *lb.Snapshot
	tcp   uint16
	udpTo map[lb.Frontend]uint16 // Ports.UDP as given
	svcs  map[lb.ServicePortName]*steered
	// elems holds, per family, each element and its value ("" in a set);
	// refs how many Service ports want it (a UDP socket port may be
	// shared).
	elems [2]map[elemKey]string
	refs  [2]map[elemKey]int
	// udp is the port each steered UDP frontend is redirected to.
	udp map[lb.Frontend]uint16
}

// steered is one Service port's part of the table.
type steered struct {
	elems [2][]elemKV
	udp   []lb.Frontend // the UDP frontends it steers (their ports are in udpTo)
}

type elemKV struct {
	k elemKey
	v string
}

func (r *Redirector) newNFTState(snap *lb.Snapshot, ports Ports) *nftState {
	d := &nftState{snap: snap, tcp: ports.TCP, udpTo: maps.Clone(ports.UDP), svcs: make(map[lb.ServicePortName]*steered, snap.Len()),
		udp: map[lb.Frontend]uint16{}}
	for _, fam := range r.families {
		d.elems[fam] = make(map[elemKey]string, snap.Len()+16)
		d.refs[fam] = make(map[elemKey]int, snap.Len()+16)
	}
	return d
}

// steerOf is what bal contributes to the table.
func (r *Redirector) steerOf(snap *lb.Snapshot, bal *lb.Balancer, ports Ports, errs []error) (*steered, []error) {
	st := &steered{}
	errs = r.walkBalancer(snap, bal, ports, func(x target) {
		add := func(set, key, val string) {
			st.elems[x.fam] = append(st.elems[x.fam], elemKV{elemKey{set, key}, val})
		}
		if x.proto == lb.UDP && x.to != 0 {
			add(steertable.SetUDPSockets, nftable.PortValue(x.to), "")
			st.udp = append(st.udp, lb.Frontend{Protocol: lb.UDP, Addr: netip.AddrPortFrom(x.addr, x.port)})
		}
		switch {
		case x.nodePort && x.usable:
			add(steertable.SetNodePorts, nftable.NodePortKey(x.proto, x.port), nftable.PortValue(x.to))
		case x.nodePort:
			add(steertable.SetNodePortNoEndpoints, nftable.NodePortKey(x.proto, x.port), "")
			if x.short { // rejected too, unless steered from inside
				add(steertable.SetNodePortShortCircuit, nftable.NodePortKey(x.proto, x.port), nftable.PortValue(x.to))
			}
		case x.usable:
			add(steertable.SetFrontends, nftable.FrontendKey(x.addr, x.proto, x.port), nftable.PortValue(x.to))
		default:
			add(steertable.SetNoEndpoints, nftable.FrontendKey(x.addr, x.proto, x.port), "")
			if x.short {
				add(steertable.SetShortCircuit, nftable.FrontendKey(x.addr, x.proto, x.port), nftable.PortValue(x.to))
			}
		}
	}, errs)
	return st, errs
}

// put adds name's part to d.
func (d *nftState) put(name lb.ServicePortName, st *steered) {
	d.svcs[name] = st
	for fam, es := range st.elems {
		for _, e := range es {
			d.refs[fam][e.k]++
			d.elems[fam][e.k] = e.v // a frontend or NodePort belongs to one Service port
		}
	}
	for _, fe := range st.udp {
		d.udp[fe] = d.udpTo[fe]
	}
}

// drop removes name's part from d.
func (d *nftState) drop(name lb.ServicePortName) {
	st := d.svcs[name]
	if st == nil {
		return
	}
	delete(d.svcs, name)
	for fam, es := range st.elems {
		for _, e := range es {
			if d.refs[fam][e.k]--; d.refs[fam][e.k] <= 0 {
				delete(d.refs[fam], e.k)
				delete(d.elems[fam], e.k)
			}
		}
	}
	for _, fe := range st.udp {
		delete(d.udp, fe)
	}
}

// computeNFT translates snap and ports into the nftables backend's
// elements.
func (r *Redirector) computeNFT(snap *lb.Snapshot, ports Ports) (*nftState, []error) {
	d := r.newNFTState(snap, ports)
	var errs []error
	for _, bal := range snap.Balancers() {
		if bal == nil || bal.Service == nil {
			continue
		}
		var st *steered
		st, errs = r.steerOf(snap, bal, ports, errs)
		d.put(bal.Service.Name, st)
	}
	return d, errs
}

// diff is what turns have into want: the elements to delete (gone, or a
// map element whose value changes) and to add.
func diff(have, want map[elemKey]string) (del, add []nftable.Element) {
	for k, v := range have {
		if w, ok := want[k]; !ok || w != v {
			del = append(del, nftable.Element{Set: k.set, Key: k.key, Val: v})
		}
	}
	for k, v := range want {
		if h, ok := have[k]; !ok || h != v {
			add = append(add, nftable.Element{Set: k.set, Key: k.key, Val: v})
		}
	}
	return del, add
}

// applyNFT is Apply for the nftables backend. Called with r.mu held.
func (r *Redirector) applyNFT(ctx context.Context, snap *lb.Snapshot, ports Ports, full bool) error {
	start := time.Now()
	old := r.ncur
	full = full || old == nil || old.tcp != ports.TCP || !maps.Equal(old.udpTo, ports.UDP)
	var errs []error
	var err error
	changed := 0
	if !full {
		r.ncur = nil // until the kernel holds what it says
		if changed, errs, err = r.nftIncremental(ctx, old, snap, ports); err != nil {
			r.log.Warn("incremental sync failed; doing a full one", zap.Error(err))
			full, old = true, nil
		} else {
			r.ncur = old
		}
	}
	if full {
		var want *nftState
		want, errs = r.computeNFT(snap, ports)
		if err = r.nftFull(ctx, old, want); err == nil {
			r.ncur = want
		} else {
			r.ncur = nil
		}
	}
	if r.ncur != nil {
		r.forgetMoved(ctx, r.ncur.udp)
		r.clearUnsteered(ctx, snap, ports)
	}
	level := zap.DebugLevel
	if took := time.Since(start); full && (old == nil || took > time.Second) {
		level = zap.InfoLevel
	}
	fields := []zap.Field{zap.Bool("full", full), zap.Uint64("version", snap.Version), zap.Duration("duration", time.Since(start)), zap.Error(err)}
	if !full {
		fields = append(fields, zap.Int("changed", changed))
	}
	r.log.Log(level, "applied", fields...)
	return errors.Join(append(errs, err)...)
}

// nftIncremental rewrites, in place in cur, the parts of the Service ports
// snap changed since cur.snap, and writes the elements that differ: one
// transaction per family that changed. It returns how many Service ports
// changed.
func (r *Redirector) nftIncremental(ctx context.Context, cur *nftState, snap *lb.Snapshot, ports Ports) (int, []error, error) {
	d := snap.Changed(cur.snap)
	names := slices.Concat(d.Removed, d.Updated, d.Added)
	var errs []error
	next := map[lb.ServicePortName]*steered{}
	for _, name := range names {
		if bal := snap.Balancer(name); bal != nil && bal.Service != nil {
			next[name], errs = r.steerOf(snap, bal, ports, errs)
		}
	}
	// The elements the change touches, as the kernel holds them now.
	var before, after [2]map[elemKey]string
	touch := func(st *steered) {
		for _, fam := range r.families {
			for _, e := range st.elems[fam] {
				if _, seen := after[fam][e.k]; seen {
					continue
				}
				after[fam][e.k] = ""
				if v, ok := cur.elems[fam][e.k]; ok {
					before[fam][e.k] = v
				}
			}
		}
	}
	for _, fam := range r.families {
		before[fam], after[fam] = map[elemKey]string{}, map[elemKey]string{}
	}
	for _, name := range names {
		if st := cur.svcs[name]; st != nil {
			touch(st)
		}
		if st := next[name]; st != nil {
			touch(st)
		}
	}
	for _, name := range names {
		cur.drop(name)
	}
	for name, st := range next {
		cur.put(name, st)
	}
	cur.snap = snap
	for _, fam := range r.families {
		for k := range after[fam] {
			if v, ok := cur.elems[fam][k]; ok {
				after[fam][k] = v
			} else {
				delete(after[fam], k)
			}
		}
		del, add := diff(before[fam], after[fam])
		if err := r.nk.Update(ctx, fam, del, add); err != nil {
			r.nftFailures[fam].Add(1)
			return len(names), errs, fmt.Errorf("updating the %v steering table: %w", fam, err)
		}
	}
	return len(names), errs, nil
}

// nftFull rewrites each family's table and rules, reads every set back and
// writes the difference. It counts a repair when the kernel held other
// than what the last successful Apply (old) wrote.
func (r *Redirector) nftFull(ctx context.Context, old, want *nftState) error {
	var diffs []string
	for _, fam := range r.families {
		intact, err := r.nk.Setup(ctx, r.layout(fam))
		if err != nil {
			r.nftFailures[fam].Add(1)
			return fmt.Errorf("writing the %v steering table: %w", fam, err)
		}
		if !intact {
			diffs = append(diffs, fmt.Sprintf("%v: table, set or chain missing or changed", fam))
		}
		have := map[elemKey]string{}
		for _, set := range steertable.Sets {
			es, err := r.nk.Elements(ctx, fam, set)
			if err != nil {
				return fmt.Errorf("reading the %v steering set %s: %w", fam, set, err)
			}
			for k, v := range es {
				have[elemKey{set, k}] = v
			}
		}
		del, add := diff(have, want.elems[fam])
		if old != nil && !maps.Equal(have, old.elems[fam]) {
			diffs = append(diffs, fmt.Sprintf("%v: %d elements differ", fam, len(del)+len(add)))
		}
		if err := r.nk.Update(ctx, fam, del, add); err != nil {
			r.nftFailures[fam].Add(1)
			return fmt.Errorf("updating the %v steering table: %w", fam, err)
		}
	}
	if !r.othersGone {
		// Only now that this table steers: removing the iptables
		// backend's rules first would leave a moment with neither.
		r.removeIPTables(ctx)
	}
	if old != nil && len(diffs) > 0 {
		r.nftRepairs.Add(1)
		r.served.Reset() // meanwhile packets met no rule: every frontend's entries are suspect
		r.log.Warn("steering table changed behind svcproxy's back; repaired", zap.Strings("differences", diffs))
	}
	return nil
}

// removeIPTables removes the iptables backend's steering a previous
// process may have left (an upgrade, or a node that switched backends),
// once this backend's table is written: both would act, and the rejects
// and drops of the old rules would stay. Without iptables tools there is
// nothing to remove; a failure is retried at the next full sync.
func (r *Redirector) removeIPTables(ctx context.Context) {
	if r.backend == "" {
		r.othersGone = true
		return
	}
	if err := netfilter.Cleanup(ctx, r.exec, chainPrefix, setPrefix, r.cfg.IPv6); err != nil {
		r.log.Warn("removing iptables steering rules left by the iptables backend", zap.Error(err))
		return
	}
	r.othersGone = true
}

// removeNFT removes the nftables backend's tables a previous process may
// have left, for the iptables backend, once its rules are written. A
// failure is retried at the next full sync, unless nf_tables cannot write
// that family's table here at all (the probe fails): then there is
// nothing to remove.
func (r *Redirector) removeNFT(ctx context.Context) {
	var errs []error
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		err := r.nk.Delete(ctx, fam)
		if err == nil {
			continue
		}
		if perr := r.nk.Probe(ctx, r.layout(fam)); perr != nil {
			r.log.Debug("not removing an nftables steering table: nftables is not usable here", zap.Stringer("family", fam), zap.Error(err))
			continue
		}
		errs = append(errs, fmt.Errorf("%v: %w", fam, err))
	}
	if err := errors.Join(errs...); err != nil {
		r.log.Warn("removing the steering table left by the nftables backend; retried at the next full sync", zap.Error(err))
		return
	}
	r.othersGone = true
}

// readSteeredNFT is readSteered for the nftables backend: the UDP
// frontends and NodePorts of the frontends and nodeports maps, and of the
// short-circuit ones (which a table written before them lacks: read when
// there).
func (r *Redirector) readSteeredNFT(ctx context.Context) (map[lb.Frontend]uint16, error) {
	out := map[lb.Frontend]uint16{}
	for _, fam := range r.families {
		for _, m := range []struct {
			set      string
			nodePort bool
			optional bool
		}{
			{steertable.SetFrontends, false, false},
			{steertable.SetNodePorts, true, false},
			{steertable.SetShortCircuit, false, true},
			{steertable.SetNodePortShortCircuit, true, true},
		} {
			es, err := r.nk.Elements(ctx, fam, m.set)
			switch {
			case err != nil && m.optional:
				continue
			case err != nil:
				return out, fmt.Errorf("reading UDP steering: %w", err)
			}
			for k, v := range es {
				to, vok := nftable.DecodePort(v)
				if !vok {
					continue
				}
				if m.nodePort {
					if proto, port, ok := nftable.DecodeNodePort(k); ok && proto == lb.UDP {
						out[lb.Frontend{Protocol: lb.UDP, Addr: netip.AddrPortFrom(unspecified(fam), port)}] = to
					}
				} else if a, proto, port, ok := nftable.DecodeFrontend(fam, k); ok && proto == lb.UDP {
					out[lb.Frontend{Protocol: lb.UDP, Addr: netip.AddrPortFrom(a, port)}] = to
				}
			}
		}
	}
	return out, nil
}
