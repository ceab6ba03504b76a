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
func (c tableConntrack) ClearUDP(ctx context.Context, vip netip.Addr, port uint16, backend netip.AddrPort) error {
	m := conntrack.Match{Proto: lb.UDP, OrigDst: netip.AddrPortFrom(vip, port), ReplySrc: backend}
	_, err := conntrack.DeleteMatching(ctx, c.t, netfilter.FamilyOf(vip), []conntrack.Match{m})
	return err
}
