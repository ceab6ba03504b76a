package main

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	mobyipvs "github.com/moby/ipvs"

	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
)

// timer adds up, per kind of kernel call, how many the IPVS mode made and
// how long they took, so a control-plane figure can say where its time
// went.
type timer struct {
	mu sync.Mutex
	by map[string]*callTime
}

type callTime struct {
	n int
	d time.Duration
}

func (t *timer) since(kind string, start time.Time) {
	d := time.Since(start)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.by == nil {
		t.by = map[string]*callTime{}
	}
	c := t.by[kind]
	if c == nil {
		c = &callTime{}
		t.by[kind] = c
	}
	c.n++
	c.d += d
}

// take returns the totals so far and starts again.
func (t *timer) take() map[string]callTime {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]callTime{}
	for k, c := range t.by {
		out[k] = *c
	}
	t.by = nil
	return out
}

// summary says where total went: each kind's calls and time, largest
// first, and the rest (the mode's own Go code: computing and diffing).
func summary(by map[string]callTime, total time.Duration) string {
	kinds := make([]string, 0, len(by))
	var sum time.Duration
	for k, c := range by {
		kinds = append(kinds, k)
		sum += c.d
	}
	sort.Slice(kinds, func(i, j int) bool { return by[kinds[i]].d > by[kinds[j]].d })
	var parts []string
	for _, k := range kinds {
		c := by[k]
		parts = append(parts, fmt.Sprintf("%s %d× %s", k, c.n, fmtDur(c.d)))
	}
	parts = append(parts, "the rest (Go: computing and diffing) "+fmtDur(max(0, total-sum)))
	return strings.Join(parts, ", ")
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.0f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	default:
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	}
}

// The kinds of calls.
const (
	callIPVSWrite = "IPVS netlink writes"
	callIPVSRead  = "IPVS netlink reads"
	callAddrs     = "rtnetlink (VIP addresses, links)"
	callIPSet     = "ipset (exec)"
	callIPTables  = "iptables-legacy (exec)"
)

type timedIPVS struct {
	ipvs.IPVS
	t *timer
}

func (x timedIPVS) GetServices() ([]*mobyipvs.Service, error) {
	defer x.t.since(callIPVSRead, time.Now())
	return x.IPVS.GetServices()
}

func (x timedIPVS) NewService(s *mobyipvs.Service) error {
	defer x.t.since(callIPVSWrite, time.Now())
	return x.IPVS.NewService(s)
}

func (x timedIPVS) UpdateService(s *mobyipvs.Service) error {
	defer x.t.since(callIPVSWrite, time.Now())
	return x.IPVS.UpdateService(s)
}

func (x timedIPVS) DelService(s *mobyipvs.Service) error {
	defer x.t.since(callIPVSWrite, time.Now())
	return x.IPVS.DelService(s)
}

func (x timedIPVS) GetDestinations(s *mobyipvs.Service) ([]*mobyipvs.Destination, error) {
	defer x.t.since(callIPVSRead, time.Now())
	return x.IPVS.GetDestinations(s)
}

func (x timedIPVS) NewDestination(s *mobyipvs.Service, d *mobyipvs.Destination) error {
	defer x.t.since(callIPVSWrite, time.Now())
	return x.IPVS.NewDestination(s, d)
}

func (x timedIPVS) UpdateDestination(s *mobyipvs.Service, d *mobyipvs.Destination) error {
	defer x.t.since(callIPVSWrite, time.Now())
	return x.IPVS.UpdateDestination(s, d)
}

func (x timedIPVS) DelDestination(s *mobyipvs.Service, d *mobyipvs.Destination) error {
	defer x.t.since(callIPVSWrite, time.Now())
	return x.IPVS.DelDestination(s, d)
}

type timedLinks struct {
	ipvs.Links
	t *timer
}

func (x timedLinks) EnsureDummy(ctx context.Context, name string) error {
	defer x.t.since(callAddrs, time.Now())
	return x.Links.EnsureDummy(ctx, name)
}

func (x timedLinks) DeleteLink(ctx context.Context, name string) error {
	defer x.t.since(callAddrs, time.Now())
	return x.Links.DeleteLink(ctx, name)
}

func (x timedLinks) Addrs(ctx context.Context, name string) ([]netip.Addr, error) {
	defer x.t.since(callAddrs, time.Now())
	return x.Links.Addrs(ctx, name)
}

func (x timedLinks) AddAddr(ctx context.Context, name string, addr netip.Addr) error {
	defer x.t.since(callAddrs, time.Now())
	return x.Links.AddAddr(ctx, name, addr)
}

func (x timedLinks) DelAddr(ctx context.Context, name string, addr netip.Addr) error {
	defer x.t.since(callAddrs, time.Now())
	return x.Links.DelAddr(ctx, name, addr)
}

func (x timedLinks) NodeAddrs(ctx context.Context, exclude string) ([]netip.Addr, error) {
	defer x.t.since(callAddrs, time.Now())
	return x.Links.NodeAddrs(ctx, exclude)
}

type timedRules struct {
	ipvs.Rules
	t *timer
}

func (x timedRules) IPTablesRestore(ctx context.Context, f ipvs.Family, data []byte) error {
	defer x.t.since(callIPTables, time.Now())
	return x.Rules.IPTablesRestore(ctx, f, data)
}

func (x timedRules) IPTablesSave(ctx context.Context, f ipvs.Family, table string) ([]byte, error) {
	defer x.t.since(callIPTables, time.Now())
	return x.Rules.IPTablesSave(ctx, f, table)
}

func (x timedRules) IPTablesVersion(ctx context.Context) (string, error) {
	defer x.t.since(callIPTables, time.Now())
	return x.Rules.IPTablesVersion(ctx)
}

func (x timedRules) IPSetRestore(ctx context.Context, data []byte) error {
	defer x.t.since(callIPSet, time.Now())
	return x.Rules.IPSetRestore(ctx, data)
}

func (x timedRules) IPSetSave(ctx context.Context) ([]byte, error) {
	defer x.t.since(callIPSet, time.Now())
	return x.Rules.IPSetSave(ctx)
}

func (x timedRules) IPSetDestroy(ctx context.Context, name string) error {
	defer x.t.since(callIPSet, time.Now())
	return x.Rules.IPSetDestroy(ctx, name)
}
