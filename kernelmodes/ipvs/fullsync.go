package ipvs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/vishvananda/netns"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// fullSync reads everything svcproxy owns from the kernel, repairs and
// prunes it, and writes what want says.
func (m *Mode) fullSync(ctx context.Context, want *desired, nodeIPs []netip.Addr) error {
	start := m.cfg.Now()
	var errs []error
	if err := m.ensureSysctls(); err != nil {
		errs = append(errs, err) // IPVS still balances; masquerade may not work
	}
	m.ensureTimeouts()
	if m.randomFully == nil {
		v := m.detectRandomFully(ctx)
		m.randomFully = &v
	}

	// Observe.
	if err := m.links.EnsureDummy(ctx, DummyInterface); err != nil {
		return fmt.Errorf("creating %s: %w", DummyInterface, err)
	}
	addrs, err := m.links.Addrs(ctx, DummyInterface)
	if err != nil {
		return fmt.Errorf("listing addresses of %s: %w", DummyInterface, err)
	}
	onLink := make(map[netip.Addr]struct{}, len(addrs))
	for _, a := range addrs {
		onLink[a.Unmap()] = struct{}{}
	}
	owned := maps.Clone(onLink)
	maps.Copy(owned, want.vips)
	for _, ip := range nodeIPs {
		owned[ip] = struct{}{}
	}
	if m.cur != nil {
		maps.Copy(owned, m.cur.vips)
		for _, ip := range m.cur.nodeIPs {
			owned[ip] = struct{}{}
		}
	}
	m.loadMade() // what another svcproxy (a rollout's other pod) recorded since
	have, err := m.readIPVS(owned, want.vs)
	if err != nil {
		return err
	}
	// A made one that is gone from an address read here (deleted behind
	// its back, or a previous run's record of one since removed) is no
	// longer this Mode's: a virtual server someone else puts there later
	// is theirs. One on an address not read (a node IP missing for now)
	// stays recorded.
	for k := range m.made {
		if _, read := owned[k.addr.Addr()]; read && have[k] == nil {
			delete(m.made, k)
		}
	}
	var diffs []string
	if m.cur != nil {
		diffs = m.differs(have, onLink, want.vs)
	}

	// Sets and rules first (the Reconciler reads, repairs and prunes
	// them), then addresses, IPVS.
	m.ruleDiffs = nil
	rs := m.ruleset(want)
	if err := m.rec.Sync(ctx, rs, true); err != nil {
		m.sets.Written(nil)
		return err
	}
	m.sets.Written(rs)
	if diffs = append(diffs, m.ruleDiffs...); len(diffs) > 0 {
		slices.Sort(diffs)
		m.repairs.Add(1)
		m.log.Warn("IPVS services, addresses, sets or rules were changed behind svcproxy's back; repairing",
			zap.Strings("differences", diffs[:min(len(diffs), 10)]), zap.Int("count", len(diffs)))
	}
	for _, vip := range sortedAddrs(want.vips) {
		if _, ok := onLink[vip]; ok {
			continue
		}
		if err := m.links.AddAddr(ctx, DummyInterface, vip); err != nil {
			errs = append(errs, fmt.Errorf("adding %v to %s: %w", vip, DummyInterface, err))
			continue
		}
		onLink[vip] = struct{}{}
	}
	errs = append(errs, m.reconcile(ctx, have, want.vs)...)
	errs = append(errs, m.reap(ctx, have, true))
	inUse := addrsOf(have)
	for _, vip := range sortedAddrs(onLink) {
		if _, ok := want.vips[vip]; ok || inUse[vip] {
			continue
		}
		if err := m.links.DelAddr(ctx, DummyInterface, vip); err != nil {
			errs = append(errs, fmt.Errorf("removing %v from %s: %w", vip, DummyInterface, err))
			continue
		}
		delete(onLink, vip)
	}
	m.cur = &state{nodeIPs: nodeIPs, vips: onLink, vs: have}
	m.log.Debug("full sync", zap.Int("virtual_servers", len(have)), zap.Int("vips", len(onLink)),
		zap.Int("members", len(want.members)), zap.Duration("duration", m.cfg.Now().Sub(start)))
	return errors.Join(errs...)
}

// readIPVS lists the virtual servers on owned addresses, but for foreign
// ones, with their real servers and connection counts, keeping what m.cur
// knows of draining.
func (m *Mode) readIPVS(owned map[netip.Addr]struct{}, want map[vsKey]*vsWant) (map[vsKey]*vsState, error) {
	svcs, err := m.ipvs.GetServices()
	if err != nil {
		return nil, fmt.Errorf("listing virtual servers: %w", err)
	}
	have := make(map[vsKey]*vsState, len(svcs))
	for _, svc := range svcs {
		k, attrs, ok := fromService(svc)
		if !ok {
			continue
		}
		if _, mine := owned[k.addr.Addr()]; !mine || m.foreign(k, want) {
			continue
		}
		ds, err := m.ipvs.GetDestinations(svc)
		if err != nil {
			return nil, fmt.Errorf("listing real servers of %v: %w", k, err)
		}
		s := &vsState{attrs: attrs, dests: make(map[netip.AddrPort]*destState, len(ds))}
		var known *vsState
		if m.cur != nil {
			known = m.cur.vs[k]
		}
		for _, d := range ds {
			a, ok := destAddr(d)
			if !ok {
				continue
			}
			st := &destState{weight: d.Weight, conns: d.ActiveConnections + d.InactiveConnections}
			if known != nil {
				if kd := known.dests[a]; kd != nil && d.Weight == 0 {
					st.draining = kd.draining
				}
			}
			s.dests[a] = st
		}
		have[k] = s
	}
	return have, nil
}

// differs lists how the virtual servers and addresses differ from what
// m.cur says was left (the Reconciler compares the sets and rules). On an
// excluded address, one that was taken over and is foreign again is not
// missing, and one not made by this Mode is not a stranger.
func (m *Mode) differs(have map[vsKey]*vsState, onLink map[netip.Addr]struct{}, want map[vsKey]*vsWant) []string {
	var diffs []string
	cur := m.cur
	for k, s := range cur.vs {
		h := have[k]
		if h == nil && m.foreign(k, want) {
			continue
		}
		if h == nil {
			diffs = append(diffs, fmt.Sprintf("virtual server %v missing", k))
			continue
		}
		if h.attrs != s.attrs {
			diffs = append(diffs, fmt.Sprintf("virtual server %v changed", k))
		}
		for a, d := range s.dests {
			if hd := h.dests[a]; hd == nil {
				diffs = append(diffs, fmt.Sprintf("real server %v of %v missing", a, k))
			} else if hd.weight != d.weight {
				diffs = append(diffs, fmt.Sprintf("real server %v of %v has weight %d, want %d", a, k, hd.weight, d.weight))
			}
		}
		for a := range h.dests {
			if s.dests[a] == nil {
				diffs = append(diffs, fmt.Sprintf("real server %v of %v is not ours", a, k))
			}
		}
	}
	for k := range have {
		if _, made := m.made[k]; cur.vs[k] == nil && (made || !m.excluded(k.addr.Addr())) {
			diffs = append(diffs, fmt.Sprintf("virtual server %v is not ours", k))
		}
	}
	for a := range cur.vips {
		if _, ok := onLink[a]; !ok {
			diffs = append(diffs, fmt.Sprintf("address %v missing from %s", a, DummyInterface))
		}
	}
	for a := range onLink {
		if _, ok := cur.vips[a]; !ok {
			diffs = append(diffs, fmt.Sprintf("address %v on %s is not ours", a, DummyInterface))
		}
	}
	return diffs
}

// Cleanup removes every virtual server svcproxy created (those on an
// address of svcproxy-ipvs0 or a node IP), the interface, the sets and the
// rules, also when another process installed them. Without IPVS in the
// kernel it still removes the rest. IPv6 rule errors are ignored when
// Config.IPv6 is off.
func (m *Mode) Cleanup(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := m.cur
	m.cur, m.needFull = nil, true
	m.draining.Store(0)
	m.loadMade() // what this or another svcproxy made on excluded addresses is to go too
	var errs []error
	if m.links == nil {
		l, err := NewLinks(netns.None())
		if err != nil {
			return fmt.Errorf("cleaning up: %w", err)
		}
		m.links = l
	}
	err := m.kernel()
	switch {
	case errors.Is(err, ErrUnavailable):
		m.log.Debug("no IPVS in the kernel: no virtual servers to remove", zap.Error(err))
	case err != nil:
		errs = append(errs, err)
	default:
		errs = append(errs, m.cleanupIPVS(ctx, cur), m.flushUDP(ctx))
		m.saveMade()
	}
	m.rec.Forget()
	errs = append(errs, netfilter.Cleanup(ctx, m.rules, chainPrefix, setPrefix, m.cfg.IPv6))
	if err := m.links.DeleteLink(ctx, DummyInterface); err != nil {
		errs = append(errs, fmt.Errorf("deleting %s: %w", DummyInterface, err))
	}
	return errors.Join(errs...)
}

func (m *Mode) cleanupIPVS(ctx context.Context, cur *state) error {
	owned := map[netip.Addr]struct{}{}
	addrs, err := m.links.Addrs(ctx, DummyInterface)
	if err != nil && !errors.Is(err, ErrNoLink) {
		return fmt.Errorf("listing addresses of %s: %w", DummyInterface, err)
	}
	for _, a := range addrs {
		owned[a.Unmap()] = struct{}{}
	}
	nodeIPs, err := m.nodeIPs(ctx)
	if err != nil {
		return err
	}
	for _, ip := range nodeIPs {
		owned[ip] = struct{}{}
	}
	if cur != nil {
		maps.Copy(owned, cur.vips)
		for _, ip := range cur.nodeIPs {
			owned[ip] = struct{}{}
		}
	}
	svcs, err := m.ipvs.GetServices()
	if err != nil {
		return fmt.Errorf("listing virtual servers: %w", err)
	}
	var errs []error
	for _, svc := range svcs {
		k, _, ok := fromService(svc)
		if _, mine := owned[k.addr.Addr()]; !ok || !mine || m.foreign(k, nil) {
			continue
		}
		if err := m.ipvs.DelService(svc); err != nil {
			errs = append(errs, fmt.Errorf("deleting virtual server %v: %w", k, err))
			continue
		}
		delete(m.made, k)
		if k.proto == lb.UDP && cur != nil && cur.vs[k] != nil {
			for a := range cur.vs[k].dests {
				m.forgetUDP(k, a)
			}
		}
	}
	return errors.Join(errs...)
}
