package redirect

import (
	"context"
	"maps"
	"net/netip"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// UnservedCleared counts the conntrack entries clearUnsteered deleted.
func (r *Redirector) UnservedCleared() uint64 { return r.served.Cleared() }

// ConntrackDeleted counts the conntrack entries of family the syncs
// deleted: those UnservedCleared counts, and those of UDP frontends
// steered elsewhere (forgetMoved).
func (r *Redirector) ConntrackDeleted(family netfilter.Family) uint64 { return r.ct.Deleted(family) }

// clearUnsteered deletes the conntrack entries of packets that reached a
// frontend before this sync steered it (at start, when its Service was
// added, or when it got endpoints), which would keep their flows
// unsteered: see conntrack.ClearUnNATed. Called with r.mu held, after a
// successful sync of snap.
func (r *Redirector) clearUnsteered(ctx context.Context, snap *lb.Snapshot, ports Ports) {
	// What is steered depends on the forwarder's ports too: a UDP frontend
	// whose socket opens only now is steered from this sync on.
	if ports.TCP != r.servedPorts.TCP || !maps.Equal(ports.UDP, r.servedPorts.UDP) {
		r.served.Recheck()
		r.servedPorts = Ports{TCP: ports.TCP, UDP: maps.Clone(ports.UDP)}
	}
	r.served.Clear(ctx, r.ct, snap, func(bal *lb.Balancer) []lb.Frontend {
		var fes []lb.Frontend
		r.walkBalancer(snap, bal, ports, func(x target) {
			if x.steered() { // a NodePort's address is unspecified: every node address
				fes = append(fes, lb.Frontend{Protocol: x.proto, Addr: netip.AddrPortFrom(x.addr, x.port)})
			}
		}, nil)
		return fes
	}, r.log)
}
