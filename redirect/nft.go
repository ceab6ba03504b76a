package redirect

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
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

// nftState is everything one Apply of the nftables backend should leave in
// the kernel.
type nftState struct {
	// elems holds, per family, each element and its value ("" in a set).
	elems [2]map[elemKey]string
	// udp is the port each steered UDP frontend is redirected to.
	udp map[lb.Frontend]uint16
}

// layout is fam's steering table beyond its elements.
func (r *Redirector) layout(fam netfilter.Family) steertable.Layout {
	l := steertable.Layout{Family: fam, Mark: r.cfg.Mark, NodePorts: true}
	if r.npRestricted[fam] {
		l.NodePortPrefixes = r.npAddrs[fam]
		l.NodePorts = len(l.NodePortPrefixes) > 0
	}
	return l
}

// computeNFT translates snap and ports into the nftables backend's
// elements.
func (r *Redirector) computeNFT(snap *lb.Snapshot, ports Ports) (*nftState, []error) {
	d := &nftState{udp: map[lb.Frontend]uint16{}}
	for _, fam := range r.families {
		d.elems[fam] = make(map[elemKey]string, snap.Len()+16)
	}
	errs := r.walk(snap, ports, func(x target) {
		m := d.elems[x.fam]
		if x.proto == lb.UDP && x.to != 0 {
			m[elemKey{steertable.SetUDPSockets, nftable.PortValue(x.to)}] = ""
			d.udp[lb.Frontend{Protocol: lb.UDP, Addr: netip.AddrPortFrom(x.addr, x.port)}] = x.to
		}
		switch {
		case x.nodePort && x.usable:
			m[elemKey{steertable.SetNodePorts, nftable.NodePortKey(x.proto, x.port)}] = nftable.PortValue(x.to)
		case x.nodePort:
			m[elemKey{steertable.SetNodePortNoEndpoints, nftable.NodePortKey(x.proto, x.port)}] = ""
		case x.usable:
			m[elemKey{steertable.SetFrontends, nftable.FrontendKey(x.addr, x.proto, x.port)}] = nftable.PortValue(x.to)
		default:
			m[elemKey{steertable.SetNoEndpoints, nftable.FrontendKey(x.addr, x.proto, x.port)}] = ""
		}
	})
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
	want, errs := r.computeNFT(snap, ports)
	old := r.ncur
	full = full || old == nil
	var err error
	if !full {
		if err = r.nftIncremental(ctx, old, want); err != nil {
			r.log.Warn("incremental sync failed; doing a full one", zap.Error(err))
			full = true
		}
	}
	if full {
		err = r.nftFull(ctx, old, want)
	}
	if err != nil {
		r.ncur = nil
	} else {
		r.ncur = want
		r.forgetMoved(ctx, want.udp)
	}
	n := 0
	for _, fam := range r.families {
		n += len(want.elems[fam])
	}
	level := zap.DebugLevel
	if took := time.Since(start); full && (old == nil || took > time.Second) {
		level = zap.InfoLevel
	}
	r.log.Log(level, "applied", zap.Bool("full", full), zap.Uint64("version", snap.Version),
		zap.Int("elements", n), zap.Duration("duration", time.Since(start)), zap.Error(err))
	return errors.Join(append(errs, err)...)
}

// nftIncremental writes the elements that differ from the last Apply, one
// transaction per family that changed.
func (r *Redirector) nftIncremental(ctx context.Context, old, want *nftState) error {
	for _, fam := range r.families {
		del, add := diff(old.elems[fam], want.elems[fam])
		if err := r.nk.Update(ctx, fam, del, add); err != nil {
			r.nftFailures[fam].Add(1)
			return fmt.Errorf("updating the %v steering table: %w", fam, err)
		}
	}
	return nil
}

// nftFull rewrites each family's table and rules, reads every set back and
// writes the difference. It counts a repair when the kernel held other
// than what the last successful Apply (old) wrote.
func (r *Redirector) nftFull(ctx context.Context, old, want *nftState) error {
	if old == nil && !r.othersGone {
		r.removeIPTables(ctx)
	}
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
	if old != nil && len(diffs) > 0 {
		r.nftRepairs.Add(1)
		r.log.Warn("steering table changed behind svcproxy's back; repaired", zap.Strings("differences", diffs))
	}
	return nil
}

// removeIPTables removes the iptables backend's steering a previous
// process may have left (an upgrade, or a node that switched backends):
// two sets of REDIRECT rules would both act. Without iptables tools there
// is nothing to remove.
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
// have left, for the iptables backend. Without nf_tables netlink there is
// nothing to remove.
func (r *Redirector) removeNFT(ctx context.Context) {
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		if err := r.nk.Delete(ctx, fam); err != nil {
			r.log.Debug("removing the nftables steering table", zap.Stringer("family", fam), zap.Error(err))
		}
	}
}

// readSteeredNFT is readSteered for the nftables backend.
func (r *Redirector) readSteeredNFT(ctx context.Context) (map[lb.Frontend]uint16, error) {
	out := map[lb.Frontend]uint16{}
	for _, fam := range r.families {
		fes, err := r.nk.Elements(ctx, fam, steertable.SetFrontends)
		if err != nil {
			return out, fmt.Errorf("reading UDP steering: %w", err)
		}
		for k, v := range fes {
			a, proto, port, ok := nftable.DecodeFrontend(fam, k)
			to, vok := nftable.DecodePort(v)
			if ok && vok && proto == lb.UDP {
				out[lb.Frontend{Protocol: lb.UDP, Addr: netip.AddrPortFrom(a, port)}] = to
			}
		}
		nps, err := r.nk.Elements(ctx, fam, steertable.SetNodePorts)
		if err != nil {
			return out, fmt.Errorf("reading UDP steering: %w", err)
		}
		for k, v := range nps {
			proto, port, ok := nftable.DecodeNodePort(k)
			to, vok := nftable.DecodePort(v)
			if ok && vok && proto == lb.UDP {
				out[lb.Frontend{Protocol: lb.UDP, Addr: netip.AddrPortFrom(unspecified(fam), port)}] = to
			}
		}
	}
	return out, nil
}
