package nftables

import (
	"encoding/binary"
	"net/netip"
	"time"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/nftable"
)

// elem is one element a Service port puts in a set of its family's table.
type elem struct{ set, key, val string }

// svcElems is what one Service port puts in each family's table.
type svcElems struct {
	elems [2][]elem
	// flows are, per family, each UDP frontend (a NodePort when its
	// address is unset) and an endpoint it may be DNATed to, as the
	// conntrack entries of such flows: when the pair goes, so must they.
	flows [2][]conntrack.Match
	// sticky, for a Service port with session affinity, maps each of its
	// frontend keys (FrontendKey, or NodePortKey) to the endpoint values a
	// client may be remembered with: an affinity element pointing elsewhere
	// is stale.
	sticky [2]map[string][]string
}

// affinitySeconds is a Service's affinity timeout in whole seconds (0:
// none), rounded up as kube-proxy does.
func affinitySeconds(svc *lb.Service) uint32 {
	if svc.AffinityTimeout <= 0 {
		return 0
	}
	return uint32((svc.AffinityTimeout + time.Second - 1) / time.Second)
}

// compute translates one Service port into its elements for family fam,
// in se. It decides nothing the snapshot has not: the pools say which
// endpoints serve internal and external traffic; compute writes them down.
func (m *Mode) compute(snap *lb.Snapshot, bal *lb.Balancer, fam netfilter.Family, se *svcElems) {
	svc := bal.Service
	inFamily := func(p *lb.Pool) []netip.AddrPort {
		if p == nil {
			return nil
		}
		var out []netip.AddrPort
		for _, b := range p.Backends() {
			if a := netip.AddrPortFrom(b.Addr.Addr().Unmap(), b.Addr.Port()); netfilter.FamilyOf(a.Addr()) == fam {
				out = append(out, a)
			}
		}
		return out
	}
	intEps, extEps := inFamily(bal.Internal), inFamily(bal.External)
	// The short circuit (externalTrafficPolicy Local): pods and the node
	// get the Cluster policy's endpoints at the external frontends, from
	// their own slots.
	scEps := inFamily(bal.ShortCircuit)
	var out []elem
	var flows []conntrack.Match
	secs := affinitySeconds(svc)
	// slots writes a frontend's (or NodePort's, in the NodePort sets) m
	// endpoint slots, from ShortSlot on for its short circuit, and the
	// slots element that picks one of them.
	slots := func(key string, eps []netip.AddrPort, nodePort, short bool, front netip.AddrPort) {
		m := min(len(eps), Slots)
		vals := make([]string, m)
		for i := range vals {
			vals[i] = nftable.EndpointValue(eps[i])
		}
		set, slotsSet, chain, first := SetServiceEndpoints, SetServiceSlots, SlotsChain(m), 0
		switch {
		case nodePort && short:
			set, slotsSet, chain, first = SetNodePortEndpoints, SetNodePortShortCircuitSlots, NodePortShortSlotsChain(m), ShortSlot
			out = append(out, elem{set: SetNodePortShortCircuit, key: key})
		case nodePort:
			set, slotsSet, chain = SetNodePortEndpoints, SetNodePortSlots, NodePortSlotsChain(m)
		case short:
			slotsSet, chain, first = SetShortCircuitSlots, ShortSlotsChain(m), ShortSlot
			out = append(out, elem{set: SetShortCircuit, key: key})
		}
		// The m keys share one string (one allocation, not m).
		n := len(key) + 4
		buf := make([]byte, 0, m*n)
		for i := range m {
			buf = binary.NativeEndian.AppendUint32(append(buf, key...), uint32(first+i))
		}
		keys := string(buf)
		for i := range m {
			out = append(out, elem{set, keys[i*n : (i+1)*n], vals[i]})
		}
		out = append(out, elem{slotsSet, key, chain})
		if secs > 0 {
			if se.sticky[fam] == nil {
				se.sticky[fam] = map[string][]string{}
			}
			if _, twice := se.sticky[fam][key]; !twice { // a short circuit beside the frontend's own slots
				affinity := AffinitySet(secs)
				if nodePort {
					affinity = AffinityNodePortSet(secs)
				}
				out = append(out, elem{set: affinity, key: key})
			}
			se.sticky[fam][key] = append(se.sticky[fam][key], vals...)
		}
		if svc.Protocol == lb.UDP {
			for _, ep := range eps[:min(len(eps), Slots)] {
				flows = append(flows, conntrack.Match{Proto: lb.UDP, OrigDst: front, ReplySrc: ep})
			}
		}
	}
	usedInt, usedExt, usedShort := false, false, false
	for fe, pool := range snap.Frontends(bal) {
		ip := fe.Addr.Addr().Unmap()
		if !ip.IsValid() || pool == nil || netfilter.FamilyOf(ip) != fam {
			continue
		}
		eps := intEps
		if pool.External {
			eps = extEps
		}
		key := nftable.FrontendKey(ip, svc.Protocol, fe.Addr.Port())
		front := netip.AddrPortFrom(ip, fe.Addr.Port())
		if pool.External && len(scEps) > 0 {
			slots(key, scEps, false, true, front)
			usedShort = true
		}
		if len(eps) == 0 {
			out = append(out, elem{set: SetNoEndpoints, key: key})
			continue
		}
		slots(key, eps, false, false, front)
		// MasqueradeAll is kube-proxy's: traffic sent to ClusterIPs, from
		// pods too; external traffic is masqueraded as without it.
		switch {
		case pool.External && svc.ExternalTrafficPolicy == lb.PolicyCluster, !pool.External && m.cfg.MasqueradeAll:
			out = append(out, elem{set: SetMasquerade, key: key})
		case !pool.External && m.clusterCIDR[fam].IsValid():
			out = append(out, elem{set: SetMasqueradeOffCluster, key: key})
		}
		if pool.External {
			usedExt = true
		} else {
			usedInt = true
		}
	}
	if np := snap.NodePort(bal); np != 0 && m.nodePorts[fam] {
		key := nftable.NodePortKey(svc.Protocol, np)
		if len(scEps) > 0 {
			slots(key, scEps, true, true, netip.AddrPortFrom(netip.Addr{}, np))
			usedShort = true
		}
		if len(extEps) == 0 {
			out = append(out, elem{set: SetNodePortNoEndpoints, key: key})
		} else {
			slots(key, extEps, true, false, netip.AddrPortFrom(netip.Addr{}, np))
			if svc.ExternalTrafficPolicy == lb.PolicyCluster {
				out = append(out, elem{set: SetNodePortMasquerade, key: key})
			}
			usedExt = true
		}
	}
	// Hairpin: an endpoint reaching itself through the Service.
	seen := map[netip.Addr]bool{}
	hairpin := func(eps []netip.AddrPort) {
		for _, ep := range eps[:min(len(eps), Slots)] {
			if !seen[ep.Addr()] {
				seen[ep.Addr()] = true
				out = append(out, elem{set: SetHairpin, key: nftable.AddrPairKey(ep.Addr())})
			}
		}
	}
	if usedInt {
		hairpin(intEps)
	}
	if usedExt {
		hairpin(extEps)
	}
	if usedShort {
		hairpin(scEps)
	}
	se.elems[fam], se.flows[fam] = out, flows
}

// state is what the mode last wrote: each Service port's elements, and
// their union per family, with how many Service ports share each hairpin
// element (the only kind Services share: an endpoint address may serve
// several).
type state struct {
	snap    *lb.Snapshot
	svcs    map[lb.ServicePortName]*svcElems
	tables  [2]Tables
	hairpin [2]map[string]int
}

func newState(snap *lb.Snapshot) *state {
	s := &state{snap: snap, svcs: make(map[lb.ServicePortName]*svcElems, snap.Len())}
	for fam := range s.tables {
		s.tables[fam] = newTables()
		s.hairpin[fam] = map[string]int{}
	}
	return s
}

// delta is the element changes of one family's table: deletions first.
type delta struct{ del, add []elem }

func (d *delta) empty() bool { return len(d.del)+len(d.add) == 0 }

// put adds e to the union (once per sharing Service port), recording the
// change in d.
func (s *state) put(fam netfilter.Family, e elem, d *delta) {
	if e.set == SetHairpin {
		if s.hairpin[fam][e.key]++; s.hairpin[fam][e.key] > 1 {
			return
		}
	}
	els := s.tables[fam][e.set]
	if els == nil { // an affinity timeout's set
		els = Elements{}
		s.tables[fam][e.set] = els
	}
	if old, ok := els[e.key]; ok && old != e.val { // another Service port's value: the newest wins
		d.del = append(d.del, elem{e.set, e.key, old})
	}
	els[e.key] = e.val
	d.add = append(d.add, e)
}

// drop removes e from the union once no Service port has it.
func (s *state) drop(fam netfilter.Family, e elem, d *delta) {
	if e.set == SetHairpin {
		if s.hairpin[fam][e.key]--; s.hairpin[fam][e.key] > 0 {
			return
		}
		delete(s.hairpin[fam], e.key)
	}
	els := s.tables[fam][e.set]
	if v, ok := els[e.key]; ok && v == e.val {
		delete(els, e.key)
		d.del = append(d.del, e)
	}
}

// cancel removes from d what it both deletes and adds again: an element
// that stays needs no transaction.
func (d *delta) cancel() {
	if len(d.del) == 0 || len(d.add) == 0 {
		return
	}
	added := make(map[elem]bool, len(d.add))
	for _, e := range d.add {
		added[e] = true
	}
	both := map[elem]bool{}
	del := d.del[:0]
	for _, e := range d.del {
		if added[e] {
			both[e] = true
			continue
		}
		del = append(del, e)
	}
	d.del = del
	if len(both) == 0 {
		return
	}
	add := d.add[:0]
	for _, e := range d.add {
		if !both[e] {
			add = append(add, e)
		}
	}
	d.add = add
}
