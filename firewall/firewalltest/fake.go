// Package firewalltest holds the in-memory fake of firewall.Kernel and its
// packet tracer, which judges a packet as the real table would.
package firewalltest

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"

	"github.com/svcproxy/svcproxy/firewall"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/nftable"
)

// Kernel is an in-memory firewall.Kernel: each family's table is its
// elements, or absent.
type Kernel struct {
	mu     sync.Mutex
	tables map[netfilter.Family][]nftable.Element
	calls  []string
	// Fail, if set, is returned by Write (and Delete) instead of doing it.
	Fail error
}

var _ firewall.Kernel = (*Kernel)(nil)

func (k *Kernel) Write(_ context.Context, fam netfilter.Family, elems []nftable.Element) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = append(k.calls, fmt.Sprintf("write %v %d", fam, len(elems)))
	if k.Fail != nil {
		return k.Fail
	}
	for i, e := range elems {
		if e.Set != firewall.SetFirewalled && e.Set != firewall.SetAllowed {
			return fmt.Errorf("no set %s", e.Set)
		}
		if e.Set != firewall.SetAllowed {
			continue
		}
		// As the kernel's interval set: same-length bounds, first ≤ last,
		// and no two intervals overlapping.
		if len(e.Key) != len(e.End) || e.Key > e.End {
			return fmt.Errorf("adding %x-%x to %s: not an interval", e.Key, e.End, e.Set)
		}
		for _, o := range elems[:i] {
			if o.Set == e.Set && len(o.Key) == len(e.Key) && o.Key <= e.End && e.Key <= o.End {
				return fmt.Errorf("adding %x-%x to %s: overlaps %x-%x", e.Key, e.End, e.Set, o.Key, o.End)
			}
		}
	}
	if k.tables == nil {
		k.tables = map[netfilter.Family][]nftable.Element{}
	}
	k.tables[fam] = append([]nftable.Element(nil), elems...)
	return nil
}

func (k *Kernel) Delete(_ context.Context, fam netfilter.Family) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = append(k.calls, fmt.Sprintf("delete %v", fam))
	if k.Fail != nil {
		return k.Fail
	}
	delete(k.tables, fam)
	return nil
}

// Calls returns the calls made so far ("write IPv4 3", "delete IPv6") and
// forgets them.
func (k *Kernel) Calls() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	c := k.calls
	k.calls = nil
	return c
}

// Has reports whether fam's table exists.
func (k *Kernel) Has(fam netfilter.Family) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.tables[fam]
	return ok
}

// Admits traces a packet from src to dst over proto through the tables:
// false if the check chain drops it.
func (k *Kernel) Admits(proto lb.Protocol, src netip.Addr, dst netip.AddrPort) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	fam := netfilter.FamilyOf(dst.Addr())
	key := nftable.FrontendKey(dst.Addr(), proto, dst.Port())
	firewalled := false
	for _, e := range k.tables[fam] {
		firewalled = firewalled || (e.Set == firewall.SetFirewalled && e.Key == key)
	}
	if !firewalled {
		return true
	}
	s := string(src.Unmap().AsSlice())
	for _, e := range k.tables[fam] {
		// An interval of a concatenation: every field between its first
		// and last value; the frontend fields are single values here.
		if e.Set == firewall.SetAllowed && strings.HasPrefix(e.Key, key) && strings.HasPrefix(e.End, key) &&
			len(e.Key) == len(key)+len(s) && e.Key[len(key):] <= s && s <= e.End[len(key):] {
			return true
		}
	}
	return false
}
