package ipvs

import (
	"context"
	"net/netip"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// tableConntrack is the real Conntrack: a conntrack.Table, ctnetlink's.
type tableConntrack struct{ t conntrack.Table }

// NewConntrack returns the real Conntrack, over ctnetlink in the named
// network namespace (as ip netns knows it; "": the caller's). Its socket
// opens on first use, so a node without ctnetlink fails only then.
func NewConntrack(netns string) Conntrack { return tableConntrack{conntrack.NewNetlink(netns)} }

// ClearUDP implements Conntrack: `conntrack -D -p udp --orig-dst vip
// --orig-port-dst port --reply-src backend-ip --reply-port-src
// backend-port`, in one read of the table.
func (c tableConntrack) ClearUDP(ctx context.Context, vip netip.Addr, port uint16, backend netip.AddrPort) (int, error) {
	m := conntrack.Match{Proto: lb.UDP, OrigDst: netip.AddrPortFrom(vip, port), ReplySrc: backend}
	return conntrack.DeleteMatching(ctx, c.t, netfilter.FamilyOf(vip), []conntrack.Match{m})
}

// clearUDP is ClearUDP of k's flows answered by a, counted in
// ConntrackDeleted.
func (m *Mode) clearUDP(ctx context.Context, k vsKey, a netip.AddrPort) error {
	n, err := m.conntrack.ClearUDP(ctx, k.addr.Addr(), k.addr.Port(), a)
	m.ctDeleted[netfilter.FamilyOf(k.addr.Addr())].Add(uint64(n))
	return err
}

// ConntrackDeleted counts the conntrack entries of family deleted with the
// real servers of UDP virtual servers.
func (m *Mode) ConntrackDeleted(family netfilter.Family) uint64 { return m.ctDeleted[family].Load() }
