package ipvs

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// forgetUDP notes that the UDP flows of virtual server k answered by real
// server a lose their conntrack entries at the end of the sync (flushUDP),
// so that the next datagram of such a flow is scheduled afresh instead of
// following a stale entry to a real server that is gone. A virtual server
// of no single address and port (not svcproxy's) has none noted: its match
// would take other flows.
func (m *Mode) forgetUDP(k vsKey, a netip.AddrPort) {
	if vip := k.addr.Addr(); vip.IsValid() && !vip.IsUnspecified() && k.addr.Port() != 0 {
		fam := netfilter.FamilyOf(vip)
		m.staleUDP[fam] = append(m.staleUDP[fam], conntrack.Match{Proto: lb.UDP, OrigDst: k.addr, ReplySrc: a})
	}
}

// flushUDP deletes the entries forgetUDP noted: one read of the table per
// family, however many real servers went.
func (m *Mode) flushUDP(ctx context.Context) error {
	err := conntrack.DeleteMatchingByFamily(ctx, m.ct, m.staleUDP)
	m.staleUDP = [2][]conntrack.Match{}
	if err != nil {
		return fmt.Errorf("clearing the conntrack entries of removed UDP real servers: %w", err)
	}
	return nil
}

// ConntrackDeleted counts the conntrack entries of family deleted with the
// real servers of UDP virtual servers.
func (m *Mode) ConntrackDeleted(family netfilter.Family) uint64 { return m.ct.Deleted(family) }
