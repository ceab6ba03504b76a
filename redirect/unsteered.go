package redirect

import (
	"context"
	"net/netip"
	"slices"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/lb"
)

// unsteered follows which frontends are steered to the forwarder (they have
// endpoints), to clear what conntrack remembers of the packets that reached
// one before it was: see clearUnsteered.
type unsteered struct {
	snap   *lb.Snapshot                         // what byName and count are of; nil: nothing yet
	byName map[lb.ServicePortName][]lb.Frontend // each Service port's steered frontends
	count  map[lb.Frontend]int                  // how many of byName's lists hold each
}

// clearUnsteered deletes the conntrack entries of packets that reached a
// frontend before this sync steered it (at start, when its Service was
// added, or when it got endpoints): conntrack does not consult the nat
// rules again for a packet it takes to be one of those flows, so the flow
// would go on unsteered. For UDP that is every datagram of a client that
// keeps its port (a resolver), as kube-proxy clears UDP flows that are not
// DNATed to an endpoint; for TCP it is a SYN that went nowhere, whose
// retransmissions, and any new connection from the same client port for
// two minutes, would follow it (entries in SYN_SENT only: an established
// connection that was never steered keeps going as it is). Only entries
// whose destination no rule rewrote are deleted; one read of the conntrack
// table per family, only when a frontend became steered. Called with r.mu
// held, after a successful sync of snap.
func (r *Redirector) clearUnsteered(ctx context.Context, snap *lb.Snapshot, ports Ports) {
	u := &r.unsteered
	var names []lb.ServicePortName
	if u.snap == nil {
		u.byName, u.count = map[lb.ServicePortName][]lb.Frontend{}, map[lb.Frontend]int{}
		for _, bal := range snap.Balancers() {
			names = append(names, bal.Service.Name)
		}
	} else {
		d := snap.Changed(u.snap)
		names = slices.Concat(d.Removed, d.Updated, d.Added)
	}
	u.snap = snap
	next := make(map[lb.ServicePortName][]lb.Frontend, len(names))
	for _, name := range names {
		var fes []lb.Frontend
		r.walkBalancer(snap, snap.Balancer(name), ports, func(x target) {
			if x.usable && !x.nodePort {
				fes = append(fes, lb.Frontend{Protocol: x.proto, Addr: netip.AddrPortFrom(x.addr, x.port)})
			}
		}, nil)
		next[name] = fes
	}
	fresh := map[lb.Frontend]bool{}
	var inFamily [2]bool
	for _, fes := range next {
		for _, fe := range fes {
			if u.count[fe] == 0 {
				fresh[fe] = true
				inFamily[familyOf(fe.Addr.Addr())] = true
			}
		}
	}
	for _, name := range names {
		for _, fe := range u.byName[name] {
			if u.count[fe]--; u.count[fe] <= 0 {
				delete(u.count, fe)
			}
		}
		delete(u.byName, name)
		if fes := next[name]; len(fes) > 0 {
			u.byName[name] = fes
			for _, fe := range fes {
				u.count[fe]++
			}
		}
	}
	if len(fresh) == 0 {
		return
	}
	for _, fam := range r.families {
		if !inFamily[fam] {
			continue
		}
		n, err := r.ct.Delete(ctx, fam, func(f conntrack.Flow) bool {
			return !f.DstNATed() && fresh[lb.Frontend{Protocol: f.Proto, Addr: f.OrigDst}] &&
				(f.Proto != lb.TCP || f.TCPState == conntrack.SynSent)
		})
		if err != nil {
			r.log.Warn("cannot clear conntrack entries of packets sent to Services before they were steered; such a flow stays unsteered until it ends",
				zap.Stringer("family", fam), zap.Error(err))
			continue
		}
		if n > 0 {
			r.log.Info("cleared conntrack entries of packets sent to Services before they were steered", zap.Stringer("family", fam), zap.Int("entries", n))
		}
	}
}
