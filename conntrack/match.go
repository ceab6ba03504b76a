package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// Match picks entries the way a `conntrack -D` filter does: by protocol,
// by where the client sent the packets, and by where replies come from
// (the endpoint a rule DNATed the flow to).
type Match struct {
	Proto lb.Protocol
	// OrigDst is where the client sent the packets. An invalid address
	// stands for every address of the family (a NodePort), port 0 for
	// every port; an unspecified address is only itself.
	OrigDst netip.AddrPort
	// ReplySrc is where replies come from; invalid: anywhere.
	ReplySrc netip.AddrPort
}

// Matches reports whether m picks f. It never picks an entry of a protocol
// svcproxy does not serve (Flow.Other).
func (m Match) Matches(f Flow) bool {
	if f.Other || f.Proto != m.Proto {
		return false
	}
	if p := m.OrigDst.Port(); p != 0 && f.OrigDst.Port() != p {
		return false
	}
	if !m.anyDst() && f.OrigDst.Addr() != m.OrigDst.Addr() {
		return false
	}
	return !m.ReplySrc.IsValid() || f.ReplySrc == m.ReplySrc
}

func (m Match) anyDst() bool { return !m.OrigDst.Addr().IsValid() }

// String is m as conntrack's options would say it, shortened: "udp dst
// 10.96.0.53 dport 53 reply-src 10.244.1.5:53".
func (m Match) String() string {
	var b strings.Builder
	b.WriteString(netfilter.ProtoName(m.Proto))
	if !m.anyDst() {
		b.WriteString(" dst " + m.OrigDst.Addr().String())
	}
	if p := m.OrigDst.Port(); p != 0 {
		fmt.Fprintf(&b, " dport %d", p)
	}
	if m.ReplySrc.IsValid() {
		b.WriteString(" reply-src " + m.ReplySrc.String())
	}
	return b.String()
}

// DeleteMatching deletes family's entries that any of ms picks, in one
// read of the table however many ms there are (the conntrack tool reads it
// once per filter), and returns how many it deleted. Each entry is held
// against the ms of its destination port only. With no ms it reads
// nothing.
func DeleteMatching(ctx context.Context, t Table, family netfilter.Family, ms []Match) (int, error) {
	if len(ms) == 0 {
		return 0, nil
	}
	byPort := map[uint16][]Match{} // 0: any port
	for _, m := range ms {
		byPort[m.OrigDst.Port()] = append(byPort[m.OrigDst.Port()], m)
	}
	anyPort := byPort[0]
	return t.Delete(ctx, family, func(f Flow) bool {
		if p := f.OrigDst.Port(); p != 0 {
			for _, m := range byPort[p] {
				if m.Matches(f) {
					return true
				}
			}
		}
		for _, m := range anyPort {
			if m.Matches(f) {
				return true
			}
		}
		return false
	})
}

// DeleteMatchingByFamily is DeleteMatching of each family's matches (ms is
// indexed by netfilter.Family): one read of the table of each family that
// has some. An error names the family, how many matches it had and the
// first few.
func DeleteMatchingByFamily(ctx context.Context, t Table, ms [2][]Match) error {
	var errs []error
	for fam, fms := range ms {
		if _, err := DeleteMatching(ctx, t, netfilter.Family(fam), fms); err != nil {
			errs = append(errs, fmt.Errorf("%d matches (%v…): %w", len(fms), fms[:min(len(fms), 4)], err))
		}
	}
	return errors.Join(errs...)
}
