package conntrack

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// Served follows the frontends a mode serves (steers to the forwarder, or
// DNATs to endpoints), to tell at each sync which ones started being
// served. Its owner serializes the calls.
type Served struct {
	snap    *lb.Snapshot                         // what byName and count are of; nil: nothing yet
	byName  map[lb.ServicePortName][]lb.Frontend // each Service port's served frontends
	count   map[lb.Frontend]int                  // how many of byName's lists hold each
	peak    int                                  // the most Service ports byName held since its maps were made
	recheck bool                                 // the next Fresh visits every Service port
	cleared atomic.Uint64                        // entries Clear deleted
}

// Fresh records the frontends snap serves, as frontends lists them for one
// Service port (called with nil for a port snap no longer has), and
// returns those that were not served at the last call: at the first, all
// of them. After the first call it visits only the Service ports that
// changed since (every one after Recheck). Call it after each successful
// sync of snap.
func (s *Served) Fresh(snap *lb.Snapshot, frontends func(*lb.Balancer) []lb.Frontend) map[lb.Frontend]bool {
	var names []lb.ServicePortName
	switch {
	case s.snap == nil:
		s.byName, s.count = map[lb.ServicePortName][]lb.Frontend{}, map[lb.Frontend]int{}
		for _, bal := range snap.Balancers() {
			names = append(names, bal.Service.Name)
		}
	case s.recheck: // what snap has, and what it no longer has
		for _, bal := range snap.Balancers() {
			names = append(names, bal.Service.Name)
		}
		for name := range s.byName {
			if snap.Balancer(name) == nil {
				names = append(names, name)
			}
		}
	default:
		d := snap.Changed(s.snap)
		names = slices.Concat(d.Removed, d.Updated, d.Added)
	}
	s.snap, s.recheck = snap, false
	next := make(map[lb.ServicePortName][]lb.Frontend, len(names))
	fresh := map[lb.Frontend]bool{}
	for _, name := range names {
		fes := frontends(snap.Balancer(name))
		next[name] = fes
		for _, fe := range fes {
			if s.count[fe] == 0 {
				fresh[fe] = true
			}
		}
	}
	// A frontend that moved from one Service port to another in this
	// change was served before: counted before the old lists go.
	for _, name := range names {
		for _, fe := range s.byName[name] {
			if s.count[fe]--; s.count[fe] <= 0 {
				delete(s.count, fe)
			}
		}
		delete(s.byName, name)
		if fes := next[name]; len(fes) > 0 {
			s.byName[name] = fes
			for _, fe := range fes {
				s.count[fe]++
			}
		}
	}
	s.shrink()
	return fresh
}

// Recheck makes the next Fresh visit every Service port: what the mode
// serves changed for reasons of its own, not the snapshot's (a socket the
// forwarder could open only now).
func (s *Served) Recheck() { s.recheck = true }

// Reset forgets what was served: the next Fresh finds everything fresh.
// For when the rules were missing (removed by someone, repaired, cleaned
// up): packets meanwhile met none.
func (s *Served) Reset() {
	s.snap, s.byName, s.count, s.peak, s.recheck = nil, nil, nil, 0, false
}

// Cleared counts the entries Clear deleted; safe to call at any time.
func (s *Served) Cleared() uint64 { return s.cleared.Load() }

// shrink makes byName and count anew once they hold far fewer entries than
// they once did: a Go map keeps the room of its largest size, and after a
// cluster shrinks from 60,000 Services that room would stay.
func (s *Served) shrink() {
	n := len(s.byName)
	if n > s.peak {
		s.peak = n
	}
	if s.peak < 1024 || n > s.peak/4 {
		return
	}
	byName := make(map[lb.ServicePortName][]lb.Frontend, n)
	for name, fes := range s.byName {
		byName[name] = fes
	}
	count := make(map[lb.Frontend]int, len(s.count))
	for fe, c := range s.count {
		count[fe] = c
	}
	s.byName, s.count, s.peak = byName, count, n
}

// ClearUnNATed deletes the entries of packets sent to the fresh frontends
// before they were served, those whose destination no rule rewrote:
// conntrack does not consult the nat rules again for a packet it takes to
// be one of those flows, so the flow would go on unserved. For UDP that is
// every datagram of a client that keeps its port (a resolver): kube-proxy
// clears UDP entries not DNATed to an endpoint for the same reason. For TCP
// it is a SYN that went nowhere, whose retransmissions, and a new
// connection from the same client port for two minutes, would follow it:
// entries in SYN_SENT only, as an established connection that was never
// NATed goes on as it is. A UDP frontend whose address is unspecified (a
// NodePort) stands for every address of its family, as kube-proxy matches
// NodePort flows by port. One read of the table per family that has fresh
// frontends; it returns how many entries it deleted.
func ClearUnNATed(ctx context.Context, t Table, fresh map[lb.Frontend]bool) (int, error) {
	var inFamily [2]bool
	for fe := range fresh {
		inFamily[familyOf(fe)] = true
	}
	total := 0
	var errs []error
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		if !inFamily[fam] {
			continue
		}
		all := netip.IPv4Unspecified()
		if fam == netfilter.IPv6 {
			all = netip.IPv6Unspecified()
		}
		n, err := t.Delete(ctx, fam, func(f Flow) bool {
			switch {
			case f.Other || f.DstNATed():
				return false
			case f.Proto == lb.TCP:
				// A SYN to a NodePort not served yet met the node itself
				// and was refused, which ends its entry: ClusterIPs,
				// ExternalIPs and LoadBalancer IPs only.
				return f.TCPState == SynSent && fresh[lb.Frontend{Protocol: f.Proto, Addr: f.OrigDst}]
			}
			return fresh[lb.Frontend{Protocol: f.Proto, Addr: f.OrigDst}] ||
				fresh[lb.Frontend{Protocol: f.Proto, Addr: netip.AddrPortFrom(all, f.OrigDst.Port())}]
		})
		total += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return total, errors.Join(errs...)
}

func familyOf(fe lb.Frontend) netfilter.Family { return netfilter.FamilyOf(fe.Addr.Addr()) }

// Clear is Fresh, then ClearUnNATed of what it found in t, logged: what
// each mode calls after a successful sync of snap. A failure is logged and
// not retried (the frontends count as served): such a flow stays
// unserved until it ends, as before svcproxy cleared any.
func (s *Served) Clear(ctx context.Context, t Table, snap *lb.Snapshot, frontends func(*lb.Balancer) []lb.Frontend, log *zap.Logger) {
	fresh := s.Fresh(snap, frontends)
	if len(fresh) == 0 {
		return
	}
	n, err := ClearUnNATed(ctx, t, fresh)
	s.cleared.Add(uint64(n))
	if err != nil {
		log.Warn("cannot clear conntrack entries of packets sent to Services before they were served; such a flow stays unserved until it ends", zap.Error(err))
	}
	if n > 0 {
		log.Info("cleared conntrack entries of packets sent to Services before they were served", zap.Int("entries", n))
	}
}

// WithEndpoints lists bal's frontends in snap that a DNAT mode serves: its
// TCP and UDP frontends whose pool has endpoints (or whose short circuit
// has: lb.Pool.Serves), and its NodePort (the unspecified address of IPv4,
// and of IPv6 with ipv6) when its external pool has; IPv6 frontends only
// with ipv6. nil: none.
func WithEndpoints(snap *lb.Snapshot, bal *lb.Balancer, ipv6 bool) []lb.Frontend {
	if bal == nil || bal.Service == nil || bal.Service.Protocol != lb.TCP && bal.Service.Protocol != lb.UDP {
		return nil
	}
	var out []lb.Frontend
	for fe, pool := range snap.Frontends(bal) {
		if pool != nil && pool.Serves() && (ipv6 || familyOf(fe) == netfilter.IPv4) {
			out = append(out, fe)
		}
	}
	if np := snap.NodePort(bal); np != 0 && bal.External != nil && bal.External.Serves() {
		out = append(out, lb.Frontend{Protocol: bal.Service.Protocol, Addr: netip.AddrPortFrom(netip.IPv4Unspecified(), np)})
		if ipv6 {
			out = append(out, lb.Frontend{Protocol: bal.Service.Protocol, Addr: netip.AddrPortFrom(netip.IPv6Unspecified(), np)})
		}
	}
	return out
}
