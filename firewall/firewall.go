package firewall

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/nftable"
)

// Config is what a Firewall writes and where.
type Config struct {
	Kernel Kernel
	// IPv6 says whether the node serves IPv6 too (asked at each Apply: the
	// daemon decides it once the mode is chosen); else IPv6 LoadBalancer
	// IPs are not restricted here (no mode serves them) and no ip6 table
	// is written. Nil: IPv4 only.
	IPv6 func() bool
	// NodeIPs are the node's own addresses, for lb.Service.AllowedSources.
	NodeIPs []netip.Addr
}

// Firewall keeps the firewall tables in step with the snapshots it is
// given. Apply is called from one goroutine at a time (the daemon's
// syncer); Cleanup and Frontends may be called from any. The tables
// outlive the process, as the forwarding rules of the kernel modes do: a
// process that stops leaves them (its successor's first Apply replaces
// them), and Cleanup (svcproxy --cleanup) removes them.
type Firewall struct {
	cfg Config

	mu sync.Mutex
	// known says the family's table is as written says: nothing is known
	// at start (a predecessor's table may be there) or after a failed
	// write or delete (an atomic write leaves the old table, but which
	// one is there is for the next Apply to settle, whatever it holds).
	known   [2]bool
	written [2][]nftable.Element // per family, what the last write left; nil: no table
}

// New returns a Firewall that has written nothing yet: its first Apply
// replaces (or removes) whatever a predecessor left.
func New(cfg Config) *Firewall { return &Firewall{cfg: cfg} }

func (f *Firewall) ipv6() bool { return f.cfg.IPv6 != nil && f.cfg.IPv6() }

// Apply makes the tables restrict the LoadBalancer frontends of snap that
// have source ranges. A family's table is written again only when what it
// must hold changed, when full is set (which also repairs a table someone
// else changed) or when the last attempt failed; one with nothing to hold
// is removed.
func (f *Firewall) Apply(ctx context.Context, snap *lb.Snapshot, full bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	ipv6 := f.ipv6()
	want := f.desired(snap, ipv6)
	var errs []error
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		w := want[fam]
		if fam == netfilter.IPv6 && !ipv6 && f.known[fam] && f.written[fam] == nil {
			continue
		}
		if f.known[fam] && !full && slices.Equal(w, f.written[fam]) {
			continue
		}
		if len(w) == 0 {
			errs = append(errs, f.remove(ctx, fam))
			continue
		}
		f.known[fam] = false
		if err := f.cfg.Kernel.Write(ctx, fam, w); err != nil {
			errs = append(errs, fmt.Errorf("writing the %v firewall: %w", fam, err))
			continue
		}
		f.known[fam], f.written[fam] = true, w
	}
	return errors.Join(errs...)
}

// remove deletes fam's table. The caller holds f.mu.
func (f *Firewall) remove(ctx context.Context, fam netfilter.Family) error {
	f.known[fam] = false
	if err := f.cfg.Kernel.Delete(ctx, fam); err != nil {
		return fmt.Errorf("removing the %v firewall: %w", fam, err)
	}
	f.known[fam], f.written[fam] = true, nil
	return nil
}

// Frontends is how many LoadBalancer frontends the tables restrict.
func (f *Firewall) Frontends() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, es := range f.written {
		for _, e := range es {
			if e.Set == SetFirewalled {
				n++
			}
		}
	}
	return n
}

// Cleanup removes the tables, also those another process wrote.
func (f *Firewall) Cleanup(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return errors.Join(f.remove(ctx, netfilter.IPv4), f.remove(ctx, netfilter.IPv6))
}

// desired is each family's elements for snap, sorted.
func (f *Firewall) desired(snap *lb.Snapshot, ipv6 bool) [2][]nftable.Element {
	var out [2][]nftable.Element
	for _, b := range snap.Balancers() {
		svc := b.Service
		if len(svc.LoadBalancerSourceRanges) == 0 || len(svc.LoadBalancerIPs) == 0 {
			continue
		}
		for fr := range snap.Frontends(b) {
			ip := fr.Addr.Addr()
			if !slices.Contains(svc.LoadBalancerIPs, ip) {
				continue // a ClusterIP or an ExternalIP only: never restricted
			}
			fam := netfilter.FamilyOf(ip)
			if fam == netfilter.IPv6 && !ipv6 {
				continue
			}
			allowed := svc.AllowedSources(ip, f.cfg.NodeIPs)
			if allowed == nil {
				continue
			}
			key := nftable.FrontendKey(ip, fr.Protocol, fr.Addr.Port())
			out[fam] = append(out[fam], nftable.Element{Set: SetFirewalled, Key: key})
			for _, r := range merge(allowed) {
				out[fam] = append(out[fam], nftable.Element{Set: SetAllowed, Key: key + string(r.first.AsSlice()), End: key + string(r.last.AsSlice())})
			}
		}
	}
	for fam := range out {
		slices.SortFunc(out[fam], func(a, b nftable.Element) int {
			return cmp.Or(cmp.Compare(a.Set, b.Set), cmp.Compare(a.Key, b.Key))
		})
	}
	return out
}

// span is an inclusive range of addresses of one family.
type span struct{ first, last netip.Addr }

// merge turns prefixes of one family into the fewest disjoint spans that
// cover them, in order: overlapping and adjacent ones become one.
func merge(prefixes []netip.Prefix) []span {
	spans := make([]span, 0, len(prefixes))
	for _, p := range prefixes {
		spans = append(spans, span{p.Masked().Addr(), lastAddr(p)})
	}
	slices.SortFunc(spans, func(a, b span) int { return a.first.Compare(b.first) })
	out := spans[:0]
	for _, s := range spans {
		if n := len(out); n > 0 {
			prev := &out[n-1]
			if next := prev.last.Next(); !next.IsValid() || s.first.Compare(next) <= 0 {
				if s.last.Compare(prev.last) > 0 {
					prev.last = s.last
				}
				continue
			}
		}
		out = append(out, s)
	}
	return out
}

// lastAddr is the last address of p (masked).
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
