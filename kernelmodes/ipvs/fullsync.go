package ipvs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netns"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/lb"
)

// observedSet is one svcproxy-ipvs-* set as `ipset save` shows it.
type observedSet struct {
	typ     string
	members []string
}

// fullSync reads everything svcproxy owns from the kernel, repairs and
// prunes it, and writes what want says.
func (m *Mode) fullSync(ctx context.Context, want *desired, nodeIPs []netip.Addr) error {
	start := m.cfg.Now()
	var errs []error
	if err := m.ensureSysctls(); err != nil {
		errs = append(errs, err) // IPVS still balances; masquerade may not work
	}
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
	have, err := m.readIPVS(owned)
	if err != nil {
		return err
	}
	sets, err := m.readSets(ctx)
	if err != nil {
		return err
	}
	saved := make([]savedRules, len(m.families))
	for i, fam := range m.families {
		for _, tbl := range []string{"nat", "filter"} {
			out, err := m.rules.IPTablesSave(ctx, fam, tbl)
			if err != nil {
				return fmt.Errorf("reading %v %s table: %w", fam, tbl, err)
			}
			parseSave(out, &saved[i])
		}
	}
	if m.cur != nil {
		if diffs := m.differs(have, onLink, sets, saved); len(diffs) > 0 {
			m.repairs.Add(1)
			m.log.Warn("IPVS services, addresses, sets or rules were changed behind svcproxy's back; repairing",
				zap.Strings("differences", diffs[:min(len(diffs), 10)]), zap.Int("count", len(diffs)))
		}
	}

	// Sets first (the rules reference them), then rules, addresses, IPVS.
	if err := m.writeSets(ctx, want, sets); err != nil {
		return err
	}
	for i, fam := range m.families {
		if err := m.writeRules(ctx, fam, &saved[i]); err != nil {
			return err
		}
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
	// Sets no rule references any more.
	wanted := m.wantedSets()
	for _, name := range slices.Sorted(maps.Keys(sets)) {
		if !slices.ContainsFunc(wanted, func(id setID) bool { return setDefs[id].name == name }) {
			if err := m.destroySet(ctx, name); err != nil {
				errs = append(errs, err)
			}
		}
	}
	m.cur = &state{nodeIPs: nodeIPs, vips: onLink, vs: have, members: want.members}
	m.log.Debug("full sync", zap.Int("virtual_servers", len(have)), zap.Int("vips", len(onLink)),
		zap.Int("members", len(want.members)), zap.Duration("duration", m.cfg.Now().Sub(start)))
	return errors.Join(errs...)
}

// readIPVS lists the virtual servers on owned addresses with their real
// servers and connection counts, keeping what m.cur knows of draining.
func (m *Mode) readIPVS(owned map[netip.Addr]struct{}) (map[vsKey]*vsState, error) {
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
		if _, mine := owned[k.addr.Addr()]; !mine {
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

// readSets reads every svcproxy-ipvs-* set.
func (m *Mode) readSets(ctx context.Context) (map[string]*observedSet, error) {
	out, err := m.rules.IPSetSave(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading ipsets: %w", err)
	}
	sets := map[string]*observedSet{}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.HasPrefix(f[1], setPrefix) {
			continue
		}
		switch f[0] {
		case "create":
			sets[f[1]] = &observedSet{typ: f[2]}
		case "add":
			if s := sets[f[1]]; s != nil {
				s.members = append(s.members, f[2])
			}
		}
	}
	return sets, nil
}

// differs lists how the kernel differs from what m.cur says was left.
func (m *Mode) differs(have map[vsKey]*vsState, onLink map[netip.Addr]struct{}, sets map[string]*observedSet, saved []savedRules) []string {
	var diffs []string
	cur := m.cur
	for k, s := range cur.vs {
		h := have[k]
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
		if cur.vs[k] == nil {
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
	want := map[string][]string{}
	for mem := range cur.members {
		n := setDefs[mem.set].name
		want[n] = append(want[n], mem.String())
	}
	for _, id := range m.wantedSets() {
		name := setDefs[id].name
		s := sets[name]
		if s == nil {
			diffs = append(diffs, "set "+name+" missing")
			continue
		}
		if !sameMembers(s.members, want[name]) {
			diffs = append(diffs, fmt.Sprintf("set %s has %d members, want %d (or different ones)", name, len(s.members), len(want[name])))
		}
	}
	for i, fam := range m.families {
		for _, k := range ourChains {
			if rs, ok := saved[i].chains[k]; !ok {
				diffs = append(diffs, fmt.Sprintf("%v %s chain %s missing", fam, k.table, k.chain))
			} else if len(rs) != len(m.chainRules(fam)[k]) {
				diffs = append(diffs, fmt.Sprintf("%v %s chain %s has %d rules, want %d", fam, k.table, k.chain, len(rs), len(m.chainRules(fam)[k])))
			}
		}
		keep, del := jumpPlan(saved[i].jumps)
		for _, j := range ourJumps {
			if !keep[j] {
				diffs = append(diffs, fmt.Sprintf("%v jump %s %s -> %s missing", fam, j.table, j.from, j.to))
			}
		}
		for _, j := range del {
			diffs = append(diffs, fmt.Sprintf("%v stray rule %s %s %s", fam, j.table, j.chain, j.spec))
		}
	}
	slices.Sort(diffs)
	return diffs
}

func sameMembers(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// writeSets fills each wanted set with exactly its members: a set whose
// members differ is filled as a temporary set and swapped in, so packets
// never see it half-filled.
func (m *Mode) writeSets(ctx context.Context, want *desired, sets map[string]*observedSet) error {
	bySet := map[setID][]string{}
	for mem := range want.members {
		bySet[mem.set] = append(bySet[mem.set], mem.String())
	}
	var b strings.Builder
	for _, id := range m.wantedSets() {
		d := setDefs[id]
		members := bySet[id]
		slices.Sort(members)
		cur := sets[d.name]
		if cur != nil && cur.typ == d.typ && sameMembers(cur.members, members) {
			continue
		}
		if cur != nil && cur.typ != d.typ {
			// Of another type: the swap would fail. Our rules reference
			// it by name, so drop them first (writeRules restores them).
			if err := m.dropRules(ctx); err != nil {
				return err
			}
			if err := m.destroySet(ctx, d.name); err != nil {
				return err
			}
			cur = nil
		}
		tmp := tmpName(d.name)
		if cur == nil {
			b.WriteString(d.createLine(d.name, len(members)) + "\n")
		}
		if sets[tmp] != nil {
			b.WriteString("destroy " + tmp + "\n")
		}
		b.WriteString(d.createLine(tmp, len(members)) + "\n")
		for _, mem := range members {
			fmt.Fprintf(&b, "add %s %s\n", tmp, mem)
		}
		fmt.Fprintf(&b, "swap %s %s\ndestroy %s\n", tmp, d.name, tmp)
		delete(sets, tmp)
		sets[d.name] = &observedSet{typ: d.typ, members: members}
	}
	if b.Len() == 0 {
		return nil
	}
	if err := m.rules.IPSetRestore(ctx, []byte(b.String())); err != nil {
		return fmt.Errorf("writing ipsets: %w", err)
	}
	return nil
}

// writeRules rewrites svcproxy's chains of one family, the jumps into them,
// and removes stray SVCPROXY-IPVS-* chains and jumps, in one restore.
func (m *Mode) writeRules(ctx context.Context, fam Family, saved *savedRules) error {
	extra, tail := map[string][]string{}, map[string][]string{}
	for _, k := range slices.SortedFunc(maps.Keys(saved.chains), func(a, b chainKey) int {
		return strings.Compare(a.table+" "+a.chain, b.table+" "+b.chain)
	}) {
		if !isOurChain(k) {
			extra[k.table] = append(extra[k.table], ":"+k.chain+" - [0:0]")
			tail[k.table] = append(tail[k.table], "-X "+k.chain)
		}
	}
	keep, del := jumpPlan(saved.jumps)
	var lines []string
	for _, j := range del {
		lines = append(lines, j.table+"\x00-D "+j.chain+" "+j.spec)
	}
	for _, j := range ourJumps {
		if !keep[j] {
			lines = append(lines, j.table+"\x00-I "+j.from+" 1 -j "+j.to)
		}
	}
	for _, l := range lines {
		tbl, line, _ := strings.Cut(l, "\x00")
		extra[tbl] = append(extra[tbl], line)
	}
	if err := m.restores.Restore(ctx, m.rules, fam, ruleScript(m.chainRules(fam), extra, tail)); err != nil {
		return fmt.Errorf("writing %v rules: %w", fam, err)
	}
	return nil
}

// dropRules removes svcproxy's IPVS chains and jumps in both families.
// Errors for IPv6 are ignored when it is off (the node may lack ip6tables).
func (m *Mode) dropRules(ctx context.Context) error {
	var errs []error
	for _, fam := range []Family{IPv4, IPv6} {
		err := m.dropFamilyRules(ctx, fam)
		if err != nil && fam == IPv6 && !m.cfg.IPv6 {
			m.log.Debug("removing IPv6 rules", zap.Error(err))
			continue
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (m *Mode) dropFamilyRules(ctx context.Context, fam Family) error {
	var saved savedRules
	for _, tbl := range []string{"nat", "filter"} {
		out, err := m.rules.IPTablesSave(ctx, fam, tbl)
		if err != nil {
			return fmt.Errorf("reading %v %s table: %w", fam, tbl, err)
		}
		parseSave(out, &saved)
	}
	if len(saved.chains) == 0 && len(saved.jumps) == 0 {
		return nil
	}
	var b strings.Builder
	for _, tbl := range []string{"nat", "filter"} {
		var decl, del, drop []string
		for k := range saved.chains {
			if k.table == tbl {
				decl = append(decl, ":"+k.chain+" - [0:0]")
				drop = append(drop, "-X "+k.chain)
			}
		}
		for _, j := range saved.jumps {
			if j.table == tbl {
				del = append(del, "-D "+j.chain+" "+j.spec)
			}
		}
		if len(decl)+len(del) == 0 {
			continue
		}
		slices.Sort(decl)
		slices.Sort(drop)
		fmt.Fprintf(&b, "*%s\n%s\nCOMMIT\n", tbl, strings.Join(slices.Concat(decl, del, drop), "\n"))
	}
	if err := m.restores.Restore(ctx, m.rules, fam, []byte(b.String())); err != nil {
		return fmt.Errorf("removing %v rules: %w", fam, err)
	}
	return nil
}

// destroySet destroys a set, waiting out references the nf_tables backend
// releases asynchronously after their rule is deleted.
func (m *Mode) destroySet(ctx context.Context, name string) error {
	delay := 20 * time.Millisecond
	for attempt := 0; ; attempt++ {
		err := m.rules.IPSetDestroy(ctx, name)
		if err == nil || errors.Is(err, ErrNoSet) {
			return nil
		}
		if !errors.Is(err, ErrSetInUse) || attempt == 6 {
			return fmt.Errorf("destroying ipset %s: %w", name, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("destroying ipset %s: %w", name, ctx.Err())
		case <-time.After(delay):
			delay *= 2
		}
	}
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
		errs = append(errs, m.cleanupIPVS(ctx, cur))
	}
	errs = append(errs, m.dropRules(ctx))
	if out, err := m.rules.IPSetSave(ctx); err != nil {
		errs = append(errs, fmt.Errorf("listing ipsets: %w", err))
	} else {
		var names []string
		for line := range strings.Lines(string(out)) {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "create" && strings.HasPrefix(f[1], setPrefix) {
				names = append(names, f[1])
			}
		}
		for _, n := range names {
			errs = append(errs, m.destroySet(ctx, n))
		}
	}
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
		if _, mine := owned[k.addr.Addr()]; !ok || !mine {
			continue
		}
		if err := m.ipvs.DelService(svc); err != nil {
			errs = append(errs, fmt.Errorf("deleting virtual server %v: %w", k, err))
			continue
		}
		if k.proto == lb.UDP && cur != nil && cur.vs[k] != nil {
			for a := range cur.vs[k].dests {
				errs = append(errs, m.conntrack.ClearUDP(ctx, k.addr.Addr(), k.addr.Port(), a))
			}
		}
	}
	return errors.Join(errs...)
}
