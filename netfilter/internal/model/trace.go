package model

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/svcproxy/svcproxy/lb"
)

// Hook is where a traced packet enters the stack.
type Hook uint8

// The hooks: Prerouting for packets arriving from pods or other hosts,
// Output for packets the node itself sends.
const (
	Prerouting Hook = iota
	Output
)

func (h Hook) String() string {
	if h == Output {
		return "OUTPUT"
	}
	return "PREROUTING"
}

// Packet is the first packet of a connection or flow, for Trace.
type Packet struct {
	Src, Dst   netip.AddrPort
	Proto      lb.Protocol
	Hook       Hook
	Mark       uint32       // the socket mark (SO_MARK) of a locally sent packet
	LocalAddrs []netip.Addr // the node's addresses, for addrtype LOCAL (loopback is always local)
}

// Action is what happens to a traced packet.
type Action uint8

// The outcomes.
const (
	Accept   Action = iota // continues with its destination unchanged
	Redirect               // redirected to a local port
	Reject                 // refused (TCP reset / ICMP port unreachable)
	Drop                   // dropped
	DNAT                   // continues to the destination nat translated it to
)

func (a Action) String() string {
	switch a {
	case Accept:
		return "Accept"
	case Redirect:
		return "Redirect"
	case Reject:
		return "Reject"
	case Drop:
		return "Drop"
	case DNAT:
		return "DNAT"
	}
	return "Action(" + strconv.Itoa(int(a)) + ")"
}

// Verdict is where a traced packet goes.
type Verdict struct {
	Action Action
	Port   uint16         // Redirect: the local port
	Dst    netip.AddrPort // DNAT: the destination it was translated to
	// Masquerade: nat POSTROUTING masqueraded the packet, so it leaves
	// with the node's address as its source and replies come back through
	// the node.
	Masquerade bool
	Rule       string // the rule that decided, as "-A CHAIN spec"; "" when none did
}

func (v Verdict) String() string {
	var s string
	switch v.Action {
	case Redirect:
		s = fmt.Sprintf("Redirect to :%d", v.Port)
	case DNAT:
		s = "DNAT to " + v.Dst.String()
	default:
		s = v.Action.String()
	}
	if v.Masquerade {
		s += " (masqueraded)"
	}
	return s
}

// same reports whether v and o send a packet to the same place the same way
// (the deciding Rule aside).
func (v Verdict) same(o Verdict) bool {
	return v.Action == o.Action && v.Port == o.Port && v.Dst == o.Dst && v.Masquerade == o.Masquerade
}

// Outcome is one of the places a packet may go, with its probability.
type Outcome struct {
	Verdict
	Probability float64
}

// traced is a packet as the tables see it at one point.
type traced struct {
	Packet
	family Family
	dnat   bool // nat changed its destination (conntrack state DNAT)
}

func (p *traced) local(a netip.Addr) bool {
	return a.IsLoopback() || slices.Contains(p.LocalAddrs, a)
}

// tracer is how one walk resolves what is not determined by the packet:
// choose decides a -m statistic match of probability prob (in the kernel's
// units, over 2^31), and commit says whether -m recent --set/--update/
// --remove change the Kernel's lists.
type tracer struct {
	choose func(prob uint32) bool
	commit bool
}

// Trace follows p through the nat and filter tables the way the kernel
// would, for the matches and targets svcproxy writes (foreign rules with
// other matches never match): nat PREROUTING or OUTPUT first (REDIRECT,
// DNAT, MARK); then filter OUTPUT (and INPUT for a local destination) for a
// locally sent packet, or filter INPUT (local destination) or FORWARD for an
// arriving one; then nat POSTROUTING (MASQUERADE) for a packet that leaves
// through an interface. It takes one path: -m statistic draws from the
// Kernel's seeded random source (Seed), and -m recent --set records the source
// at the Kernel's clock (Advance), as a connection through the kernel would.
func (k *Kernel) Trace(p Packet) Verdict {
	return k.trace(p, k.oneWay())
}

// oneWay is the tracer of Trace and TraceChain: one path, drawn from the
// Kernel's random source, -m recent lists updated.
func (k *Kernel) oneWay() *tracer {
	return &tracer{
		choose: func(prob uint32) bool { return k.rng.Uint32()&0x7fffffff < prob },
		commit: true,
	}
}

// TraceAll follows p through every path -m statistic allows and returns each
// distinct outcome with its probability (they sum to 1), sorted by action
// then destination. It changes nothing: -m recent lists are read, not
// written. Tests assert "spread evenly over exactly these endpoints" with it.
func (k *Kernel) TraceAll(p Packet) []Outcome {
	type decision struct {
		prob   float64 // of the match succeeding
		chosen bool
	}
	var out []Outcome
	var explore func(prefix []bool)
	paths := 0
	explore = func(prefix []bool) {
		if paths++; paths > 1<<14 {
			return
		}
		var ds []decision
		v := k.trace(p, &tracer{choose: func(prob uint32) bool {
			k := len(ds)
			c := prob > 0
			if k < len(prefix) {
				c = prefix[k]
			}
			ds = append(ds, decision{float64(prob) / (1 << 31), c})
			return c
		}})
		pr := 1.0
		for _, d := range ds {
			if d.chosen {
				pr *= d.prob
			} else {
				pr *= 1 - d.prob
			}
		}
		if pr > 0 {
			i := slices.IndexFunc(out, func(o Outcome) bool { return o.same(v) })
			if i < 0 {
				out = append(out, Outcome{Verdict: v, Probability: pr})
			} else {
				out[i].Probability += pr
			}
		}
		for k := len(prefix); k < len(ds); k++ {
			if ds[k].chosen && ds[k].prob < 1 {
				next := make([]bool, k+1)
				for j := range k {
					next[j] = ds[j].chosen
				}
				explore(next)
			}
		}
	}
	explore(nil)
	slices.SortFunc(out, func(a, b Outcome) int {
		return cmp.Or(cmp.Compare(a.Action, b.Action), a.Dst.Compare(b.Dst), cmp.Compare(a.Port, b.Port))
	})
	return out
}

// newTraced is p as the tables first see it.
func newTraced(p Packet) *traced {
	p.Dst = netip.AddrPortFrom(p.Dst.Addr().Unmap(), p.Dst.Port())
	p.Src = netip.AddrPortFrom(p.Src.Addr().Unmap(), p.Src.Port())
	t := &traced{Packet: p}
	if !p.Dst.Addr().Is4() {
		t.family = IPv6
	}
	return t
}

func (k *Kernel) trace(p Packet, tr *tracer) Verdict {
	t := newTraced(p)
	tables := k.tables[t.family]
	natChain := "PREROUTING"
	if p.Hook == Output {
		natChain = "OUTPUT"
	}
	verdict := Verdict{Action: Accept}
	nat, _ := k.walk(tables["nat"], natChain, t, tr, 0)
	switch nat.Action {
	case Redirect:
		verdict = nat
		t.dnat = true
		t.Dst = netip.AddrPortFrom(t.redirectAddr(), nat.Port)
	case DNAT:
		verdict = nat
		t.dnat = true
		t.Dst = nat.Dst
	case Drop, Reject:
		return nat
	}
	var filterChains []string
	localDst := t.local(t.Dst.Addr())
	switch {
	case p.Hook == Output && localDst:
		filterChains = []string{"OUTPUT", "INPUT"}
	case p.Hook == Output:
		filterChains = []string{"OUTPUT"}
	case localDst:
		filterChains = []string{"INPUT"}
	default:
		filterChains = []string{"FORWARD"}
	}
	for _, c := range filterChains {
		if v, _ := k.walk(tables["filter"], c, t, tr, 0); v.Action == Reject || v.Action == Drop {
			return v
		}
	}
	// Locally sent packets (also to local addresses, through lo) and
	// forwarded ones leave through an interface: nat POSTROUTING sees them.
	if p.Hook == Output || !localDst {
		if v, _ := k.walk(tables["nat"], "POSTROUTING", t, tr, 0); v.Masquerade {
			verdict.Masquerade = true
		}
	}
	return verdict
}

// TraceChain walks one chain of p's family for p, as Trace does at that
// point of the path, for a tracer that puts something of its own between
// the hooks (the IPVS mode's: IPVS takes packets after filter INPUT or nat
// OUTPUT). It returns the verdict of the rule that decided (decided is
// false when the chain ran out or RETURNed) and p's mark after the MARK
// rules it passed, to carry into the next chain. -m statistic and -m recent
// behave as in Trace.
func (k *Kernel) TraceChain(p Packet, tableName, chainName string) (v Verdict, mark uint32, decided bool) {
	t := newTraced(p)
	tbl := k.tables[t.family][tableName]
	if tbl == nil {
		return Verdict{Action: Accept}, p.Mark, false
	}
	v, decided = k.walk(tbl, chainName, t, k.oneWay(), 0)
	return v, t.Mark, decided
}

// redirectAddr is where REDIRECT sends a packet: loopback for locally sent
// ones, the node's (first) address of the family for arriving ones.
func (p *traced) redirectAddr() netip.Addr {
	if p.Hook == Prerouting {
		for _, a := range p.LocalAddrs {
			if a.Is4() == (p.family == IPv4) && !a.IsLoopback() {
				return a
			}
		}
	}
	if p.family == IPv6 {
		return netip.IPv6Loopback()
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, 1})
}

// walk evaluates chain name for p. decided is false when the chain ran out
// or RETURNed (the caller continues); otherwise v is the verdict of a
// terminating target (ACCEPT, DROP, REJECT, REDIRECT, DNAT, MASQUERADE).
// MARK changes p's mark and goes on.
func (k *Kernel) walk(t *table, name string, p *traced, tr *tracer, depth int) (v Verdict, decided bool) {
	c := t.chains[name]
	if c == nil || depth > 32 {
		return Verdict{Action: Accept}, false
	}
	for _, r := range c.rules {
		if !k.matches(r, p, tr) {
			continue
		}
		if r.isGoto { // the sub-chain's end returns to this chain's caller
			return k.walk(t, r.target, p, tr, depth+1)
		}
		text := "-A " + name + " " + r.String()
		switch r.target {
		case "RETURN":
			return Verdict{Action: Accept}, false
		case "ACCEPT":
			return Verdict{Action: Accept, Rule: text}, true
		case "DROP":
			return Verdict{Action: Drop, Rule: text}, true
		case "REJECT":
			return Verdict{Action: Reject, Rule: text}, true
		case "REDIRECT":
			port := p.Dst.Port()
			if n, err := strconv.ParseUint(r.toPorts, 10, 16); err == nil {
				port = uint16(n)
			}
			return Verdict{Action: Redirect, Port: port, Rule: text}, true
		case "DNAT":
			a, port, err := parseNATDest(r.toDest, p.family)
			if err != nil {
				return Verdict{Action: Drop, Rule: text}, true
			}
			if port == 0 {
				port = p.Dst.Port()
			}
			return Verdict{Action: DNAT, Dst: netip.AddrPortFrom(a, port), Rule: text}, true
		case "MASQUERADE":
			return Verdict{Action: Accept, Masquerade: true, Rule: text}, true
		case "MARK":
			p.Mark = (p.Mark &^ r.xmask) ^ r.xvalue
			continue
		}
		if sub := t.chains[r.target]; sub != nil && !sub.builtin {
			if v, ok := k.walk(t, r.target, p, tr, depth+1); ok {
				return v, true
			}
		}
		// Other targets (LOG, ...) do not decide; go on.
	}
	if c.builtin && c.policy == "DROP" {
		return Verdict{Action: Drop, Rule: ":" + name + " DROP"}, true
	}
	return Verdict{Action: Accept}, false
}

func (k *Kernel) matches(r *rule, p *traced, tr *tracer) bool {
	if r.opaque || len(r.extra) > 0 {
		return false
	}
	if r.proto != "" && r.proto != ProtoName(p.Proto) {
		return false
	}
	if r.src.IsValid() && r.src.Contains(p.Src.Addr()) == r.srcNeg {
		return false
	}
	if r.dst.IsValid() && r.dst.Contains(p.Dst.Addr()) == r.dstNeg {
		return false
	}
	if r.dport != 0 && r.dport != p.Dst.Port() {
		return false
	}
	if r.hasMark && (p.Mark&r.markMask == r.mark) == r.markNeg {
		return false
	}
	if r.addrType != "" {
		if r.addrType != "LOCAL" || p.local(p.Dst.Addr()) == r.addrNeg {
			return false
		}
	}
	if r.srcType != "" {
		if r.srcType != "LOCAL" || p.local(p.Src.Addr()) == r.srcTypeNeg {
			return false
		}
	}
	if len(r.ctstates) > 0 {
		in := false
		for _, s := range r.ctstates {
			in = in || s == "NEW" || (s == "DNAT" && p.dnat)
		}
		if in == r.ctNeg {
			return false
		}
	}
	for _, m := range r.sets {
		if k.setMatches(m, p) == m.neg {
			return false
		}
	}
	if r.recent != nil && !k.recentMatches(r.recent, p, tr.commit) {
		return false
	}
	if r.hasStat && !tr.choose(r.statProb) {
		return false
	}
	return true
}

// recentSize is xt_recent's ip_list_tot: a list keeps at most this many
// addresses, forgetting the least recently seen.
const recentSize = 100

// recentMatches is xt_recent for the first packet of a connection at the
// Kernel's clock.
func (k *Kernel) recentMatches(rc *recentMatch, p *traced, commit bool) bool {
	a := p.Src.Addr()
	if rc.rdest {
		a = p.Dst.Addr()
	}
	a = maskAddr(a, rc.mask)
	list := k.recent[rc.name]
	last, seen := list[a]
	fresh := seen && (rc.seconds == 0 || k.now.Sub(last) <= time.Duration(rc.seconds)*time.Second) && rc.hits <= 1
	var match bool
	switch rc.op {
	case "--set":
		match = true
		if commit {
			k.recentSet(rc.name, a)
		}
	case "--rcheck":
		match = fresh
	case "--update":
		match = fresh
		if match && commit {
			k.recentSet(rc.name, a)
		}
	case "--remove":
		match = seen
		if match && commit {
			delete(list, a)
		}
	}
	return match != rc.neg
}

func (k *Kernel) recentSet(name string, a netip.Addr) {
	list := k.recent[name]
	if list == nil {
		list = map[netip.Addr]time.Time{}
		k.recent[name] = list
	}
	if _, ok := list[a]; !ok && len(list) >= recentSize {
		var oldest netip.Addr
		var at time.Time
		for k, t := range list {
			if !oldest.IsValid() || t.Before(at) {
				oldest, at = k, t
			}
		}
		delete(list, oldest)
	}
	list[a] = k.now
}

func maskAddr(a, mask netip.Addr) netip.Addr {
	if !mask.IsValid() || a.BitLen() != mask.BitLen() {
		return a
	}
	ab, mb := a.As16(), mask.As16()
	if a.Is4() {
		a4, m4 := a.As4(), mask.As4()
		for i := range a4 {
			a4[i] &= m4[i]
		}
		return netip.AddrFrom4(a4)
	}
	for i := range ab {
		ab[i] &= mb[i]
	}
	return netip.AddrFrom16(ab)
}

// setMatches is xt_set's test: the packet's addresses and ports picked by
// the flags must be a member, in a set of the packet's family.
func (k *Kernel) setMatches(m setMatch, p *traced) bool {
	s := k.sets[m.name]
	if s == nil {
		return false
	}
	flags := strings.Split(m.flags, ",")
	pick := func(i int) netip.AddrPort {
		if flags[i] == "src" {
			return p.Src
		}
		return p.Dst
	}
	if s.typ != typePort && (s.family == "inet") != (p.family == IPv4) {
		return false
	}
	switch s.typ {
	case typePort:
		// bitmap:port reads the port of TCP and UDP packets only
		// (ip_set_get_ip_port): an SCTP packet never matches one.
		if p.Proto != lb.TCP && p.Proto != lb.UDP {
			return false
		}
		port := int(pick(0).Port())
		_, ok := s.members[strconv.Itoa(port)]
		return ok
	case typeIP:
		_, ok := s.members[pick(0).Addr().String()]
		return ok
	case typeNet:
		a := pick(0).Addr()
		for mem := range s.members {
			if pfx, err := parsePrefix(mem); err == nil && pfx.Contains(a) {
				return true
			}
		}
		return false
	case typeIPPort, typeIPPortIP:
		dims := 2
		if s.typ == typeIPPortIP {
			dims = 3
		}
		if len(flags) < dims {
			return false
		}
		key := pick(0).Addr().String() + "," + ProtoName(p.Proto) + ":" + strconv.Itoa(int(pick(1).Port()))
		if dims == 3 {
			key += "," + pick(2).Addr().String()
		}
		_, ok := s.members[key]
		return ok
	}
	return false
}
