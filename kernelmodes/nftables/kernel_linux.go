package nftables

import (
	"context"
	"strings"
	"time"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/nftable"
)

// netlinkKernel is Kernel over nf_tables netlink: one nftable.Conn (a
// lasting socket in a named network namespace, "": the process's) writing
// the table a Layout declares.
type netlinkKernel struct{ c *nftable.Conn }

func newNetlinkKernel(ns string) Kernel { return &netlinkKernel{c: nftable.NewConn(ns)} }

// setOf is set's definition in a table of fam.
func setOf(fam netfilter.Family, set string) *nft.Set {
	a := nftable.AddrType(fam)
	s := &nft.Set{Name: set, Concatenation: true}
	switch set {
	case SetServiceSlots, SetShortCircuitSlots:
		s.IsMap = true
		s.KeyType = nft.MustConcatSetType(a, nft.TypeInetProto, nft.TypeInetService)
		s.DataType = nft.TypeVerdict
	case SetNodePortSlots, SetNodePortShortCircuitSlots:
		s.IsMap = true
		s.KeyType = nft.MustConcatSetType(nft.TypeInetProto, nft.TypeInetService)
		s.DataType = nft.TypeVerdict
	case SetServiceEndpoints:
		s.IsMap = true
		s.KeyType = nft.MustConcatSetType(a, nft.TypeInetProto, nft.TypeInetService, nft.TypeMark)
		s.DataType = nft.MustConcatSetType(a, nft.TypeInetService)
	case SetNodePortEndpoints:
		s.IsMap = true
		s.KeyType = nft.MustConcatSetType(nft.TypeInetProto, nft.TypeInetService, nft.TypeMark)
		s.DataType = nft.MustConcatSetType(a, nft.TypeInetService)
	case SetNoEndpoints, SetMasquerade, SetMasqueradeOffCluster, SetShortCircuit:
		s.KeyType = nft.MustConcatSetType(a, nft.TypeInetProto, nft.TypeInetService)
	case SetNodePortNoEndpoints, SetNodePortMasquerade, SetNodePortShortCircuit:
		s.KeyType = nft.MustConcatSetType(nft.TypeInetProto, nft.TypeInetService)
	case SetHairpin:
		s.KeyType = nft.MustConcatSetType(a, a)
	case SetAffinity:
		s.IsMap, s.HasTimeout, s.Dynamic = true, true, true
		s.KeyType = nft.MustConcatSetType(a, a, nft.TypeInetProto, nft.TypeInetService)
		s.DataType = nft.MustConcatSetType(a, nft.TypeInetService)
	default:
		if strings.HasPrefix(set, "affinity-nodeports-") {
			s.KeyType = nft.MustConcatSetType(nft.TypeInetProto, nft.TypeInetService)
		} else { // affinity-<seconds>
			s.KeyType = nft.MustConcatSetType(a, nft.TypeInetProto, nft.TypeInetService)
		}
	}
	return s
}

// The chains of each table.
const (
	chainPrerouting  = "nat-prerouting"  // nat, prerouting: jump services
	chainOutput      = "nat-output"      // nat, output: jump services
	chainServices    = "services"        // mark, DNAT frontends; NodePorts on local addresses
	chainNodePorts   = "nodeports"       // mark, DNAT NodePorts
	chainPostrouting = "nat-postrouting" // nat, postrouting: hairpin and marked masquerade
	chainFilterIn    = "filter-input"
	chainFilterOut   = "filter-output"
	chainFilterFwd   = "filter-forward"
	chainReject      = "reject-no-endpoints" // reject what has no endpoints
	// The short circuit of externalTrafficPolicy Local: pods and the
	// node, for the frontends (NodePorts) in SetShortCircuit
	// (SetNodePortShortCircuit).
	chainShortCircuit         = "short-circuit"
	chainNodePortShortCircuit = "nodeport-short-circuit"
)

// chains are the table's chains, regular ones first.
func chains() []*nft.Chain {
	base := func(name string, typ nft.ChainType, hook *nft.ChainHook, prio *nft.ChainPriority) *nft.Chain {
		return &nft.Chain{Name: name, Type: typ, Hooknum: hook, Priority: prio}
	}
	out := []*nft.Chain{{Name: chainServices}, {Name: chainNodePorts}, {Name: chainReject},
		{Name: chainShortCircuit}, {Name: chainNodePortShortCircuit}}
	for m := 1; m <= Slots; m++ {
		out = append(out, &nft.Chain{Name: SlotsChain(m)}, &nft.Chain{Name: NodePortSlotsChain(m)},
			&nft.Chain{Name: ShortSlotsChain(m)}, &nft.Chain{Name: NodePortShortSlotsChain(m)})
	}
	return append(out,
		base(chainPrerouting, nft.ChainTypeNAT, nft.ChainHookPrerouting, nft.ChainPriorityNATDest),
		base(chainOutput, nft.ChainTypeNAT, nft.ChainHookOutput, nft.ChainPriorityNATDest),
		base(chainPostrouting, nft.ChainTypeNAT, nft.ChainHookPostrouting, nft.ChainPriorityNATSource),
		base(chainFilterIn, nft.ChainTypeFilter, nft.ChainHookInput, nft.ChainPriorityFilter),
		base(chainFilterOut, nft.ChainTypeFilter, nft.ChainHookOutput, nft.ChainPriorityFilter),
		base(chainFilterFwd, nft.ChainTypeFilter, nft.ChainHookForward, nft.ChainPriorityFilter),
	)
}

// table is l's table as nftable declares it.
func table(l Layout) nftable.Table {
	t := nftable.Table{Name: Table, Family: l.Family, Chains: chains(), Rules: rules(l)}
	for _, name := range append(l.ElementSets(), SetAffinity) {
		t.Sets = append(t.Sets, setOf(l.Family, name))
	}
	return t
}

const reg1, reg32 = nftable.Reg1, nftable.Reg32

// rb builds the expressions of one family's rules.
type rb struct {
	l   Layout
	fam netfilter.Family
}

func (b rb) alen() uint32 { return nftable.AddrRegs(b.fam) * 4 }

func (b rb) loadAddr(dst bool, reg uint32) expr.Any { return nftable.LoadAddr(b.fam, dst, reg) }

// setMark sets the masquerade mark bits, keeping the others.
func (b rb) setMark() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: nftable.Native32(^b.l.Mark), Xor: nftable.Native32(b.l.Mark)},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1, SourceRegister: true},
	}
}

// dnat DNATs to the endpoint a lookup left in reg1 on.
func (b rb) dnat() expr.Any {
	family := uint32(unix.NFPROTO_IPV4)
	if b.fam == netfilter.IPv6 {
		family = unix.NFPROTO_IPV6
	}
	proto := reg32 + b.alen()/4
	return &expr.NAT{Type: expr.NATTypeDestNAT, Family: family, RegAddrMin: reg1, RegAddrMax: reg1, RegProtoMin: proto, RegProtoMax: proto, Specified: true}
}

func numgen(reg uint32, m int, offset uint32) expr.Any {
	return &expr.Numgen{Register: reg, Modulus: uint32(m), Type: unix.NFT_NG_RANDOM, Offset: offset}
}

// localSource matches a packet from one of the node's addresses (fib saddr
// type local), or with local false from none: kube-proxy's "local traffic"
// of the short circuit.
func localSource(local bool) []expr.Any {
	op := expr.CmpOpEq
	if !local {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Fib{Register: reg1, FlagSADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: op, Register: reg1, Data: nftable.Native32(unix.RTN_LOCAL)},
	}
}

// remembered DNATs a client to the endpoint the affinity map remembers
// for it and the destination frontend (or NodePort address):
// dnat to ip saddr . ip daddr . meta l4proto . th dport map @affinity.
func (b rb) remembered() []expr.Any {
	next := reg32 + 2*b.alen()/4
	return []expr.Any{
		b.loadAddr(false, reg1),
		b.loadAddr(true, reg32+b.alen()/4),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: next},
		&expr.Payload{DestRegister: next + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		nftable.MapTo(SetAffinity),
		b.dnat(),
	}
}

// remember are the two postrouting rules of one affinity timeout: a new
// connection DNATed from a frontend (or NodePort) in its set records the
// endpoint it went to,
// update @affinity { ip saddr . ct original ip daddr . meta l4proto . ct original proto-dst timeout T : ip daddr . th dport }.
func (b rb) remember(dnated []expr.Any, secs uint32) [][]expr.Any {
	alen := b.alen() / 4
	ctDst := &expr.Ct{Key: expr.CtKeyDST, Register: reg1}
	proto := &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32 + alen}
	ctPort := &expr.Ct{Key: expr.CtKeyPROTODST, Register: reg32 + alen + 1}
	// The key, then the endpoint after it.
	keyProto, data := reg32+2*alen, reg32+2*alen+2
	update := []expr.Any{
		b.loadAddr(false, reg1),
		&expr.Ct{Key: expr.CtKeyDST, Register: reg32 + alen},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: keyProto},
		&expr.Ct{Key: expr.CtKeyPROTODST, Register: keyProto + 1},
		b.loadAddr(true, data),
		&expr.Payload{DestRegister: data + alen, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Dynset{SrcRegKey: reg1, SrcRegData: data, SetName: SetAffinity, Operation: unix.NFT_DYNSET_OP_UPDATE,
			Timeout: time.Duration(secs) * time.Second},
	}
	front := append(append([]expr.Any{}, dnated...), ctDst, proto, ctPort, nftable.Lookup(AffinitySet(secs)))
	np := append(append([]expr.Any{}, dnated...),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Ct{Key: expr.CtKeyPROTODST, Register: reg32 + 1},
		nftable.Lookup(AffinityNodePortSet(secs)))
	return [][]expr.Any{append(front, update...), append(np, update...)}
}

// rules are the rules of each chain for l (see the package doc).
func rules(l Layout) map[string][][]expr.Any {
	b := rb{l: l, fam: l.Family}
	cat, lookup := nftable.Cat, nftable.Lookup
	fe, feNext := nftable.Frontend(l.Family)
	np, npNext := nftable.NodePort()
	var localNodePort [][]expr.Any
	if l.NodePorts {
		localNodePort = nftable.LocalDest(l.Family, l.NodePortPrefixes, false)
	}
	r := map[string][][]expr.Any{}

	// shortCircuit is the chain a short-circuited frontend (NodePort)
	// jumps to: the node's connections marked for masquerade, a
	// remembered client sent back (affinity), then pods (the cluster
	// CIDR) and the node to the short circuit's slots (kube-proxy's
	// "short-circuit pod traffic", "local traffic"); anyone else returns.
	// Only those frontends' connections pay for it.
	shortCircuit := func(key []expr.Any, slots string) [][]expr.Any {
		out := [][]expr.Any{cat(localSource(true), b.setMark())}
		// Neither the node nor a pod: back at once.
		outside := localSource(false)
		if l.ClusterCIDR.IsValid() {
			outside = cat(outside, []expr.Any{b.loadAddr(false, reg1)}, nftable.InPrefix(l.Family, l.ClusterCIDR, false))
		}
		out = append(out, cat(outside, []expr.Any{nftable.Verdict(expr.VerdictReturn, "")}))
		if len(l.AffinityTimeouts) > 0 {
			out = append(out, b.remembered())
		}
		if l.ClusterCIDR.IsValid() {
			out = append(out, cat([]expr.Any{b.loadAddr(false, reg1)}, nftable.InPrefix(l.Family, l.ClusterCIDR, true), key, []expr.Any{nftable.Vmap(slots)}))
		}
		return append(out, cat(localSource(true), key, []expr.Any{nftable.Vmap(slots)}))
	}

	// services: mark what is masqueraded, then DNAT a frontend (a short
	// circuit first), else hand local addresses to the NodePorts.
	r[chainServices] = append(r[chainServices], cat(fe, []expr.Any{lookup(SetMasquerade)}, b.setMark()))
	if l.ClusterCIDR.IsValid() {
		r[chainServices] = append(r[chainServices], cat([]expr.Any{b.loadAddr(false, reg1)}, nftable.InPrefix(l.Family, l.ClusterCIDR, false),
			fe, []expr.Any{lookup(SetMasqueradeOffCluster)}, b.setMark()))
	}
	r[chainServices] = append(r[chainServices], cat(fe, []expr.Any{lookup(SetShortCircuit), nftable.Verdict(expr.VerdictJump, chainShortCircuit)}))
	r[chainShortCircuit] = shortCircuit(fe, SetShortCircuitSlots)
	if len(l.AffinityTimeouts) > 0 {
		r[chainServices] = append(r[chainServices], b.remembered())
	}
	r[chainServices] = append(r[chainServices], cat(fe, []expr.Any{nftable.Vmap(SetServiceSlots)}))
	for _, m := range localNodePort {
		r[chainServices] = append(r[chainServices], cat(m, []expr.Any{nftable.Verdict(expr.VerdictJump, chainNodePorts)}))
	}
	r[chainNodePorts] = [][]expr.Any{
		cat(np, []expr.Any{lookup(SetNodePortMasquerade)}, b.setMark()),
		cat(np, []expr.Any{lookup(SetNodePortShortCircuit), nftable.Verdict(expr.VerdictJump, chainNodePortShortCircuit)}),
	}
	r[chainNodePortShortCircuit] = shortCircuit(np, SetNodePortShortCircuitSlots)
	if len(l.AffinityTimeouts) > 0 {
		r[chainNodePorts] = append(r[chainNodePorts], b.remembered())
	}
	r[chainNodePorts] = append(r[chainNodePorts], cat(np, []expr.Any{nftable.Vmap(SetNodePortSlots)}))
	// One chain per number of slots: the frontend's slot, then its
	// endpoint; a short circuit's slots from ShortSlot on.
	for m := 1; m <= Slots; m++ {
		r[SlotsChain(m)] = [][]expr.Any{cat(fe, []expr.Any{numgen(feNext, m, 0), nftable.MapTo(SetServiceEndpoints), b.dnat()})}
		r[NodePortSlotsChain(m)] = [][]expr.Any{cat(np, []expr.Any{numgen(npNext, m, 0), nftable.MapTo(SetNodePortEndpoints), b.dnat()})}
		r[ShortSlotsChain(m)] = [][]expr.Any{cat(fe, []expr.Any{numgen(feNext, m, ShortSlot), nftable.MapTo(SetServiceEndpoints), b.dnat()})}
		r[NodePortShortSlotsChain(m)] = [][]expr.Any{cat(np, []expr.Any{numgen(npNext, m, ShortSlot), nftable.MapTo(SetNodePortEndpoints), b.dnat()})}
	}
	jump := func(chain string) [][]expr.Any { return [][]expr.Any{{nftable.Verdict(expr.VerdictJump, chain)}} }
	r[chainPrerouting] = jump(chainServices)
	r[chainOutput] = jump(chainServices)

	masq := &expr.Masq{FullyRandom: true}
	for _, secs := range l.AffinityTimeouts {
		r[chainPostrouting] = append(r[chainPostrouting], b.remember(nftable.CtDNAT(expr.CmpOpNeq), secs)...)
	}
	r[chainPostrouting] = append(r[chainPostrouting], [][]expr.Any{
		// Hairpin: DNATed back to its own source.
		cat(nftable.CtDNAT(expr.CmpOpNeq), []expr.Any{b.loadAddr(false, reg1), b.loadAddr(true, reg32+b.alen()/4), lookup(SetHairpin), masq}),
		cat(nftable.Marked(l.Mark, false), []expr.Any{nftable.Verdict(expr.VerdictReturn, "")}),
		{&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
			&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: nftable.Native32(^l.Mark), Xor: nftable.Native32(0)},
			&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1, SourceRegister: true}, masq},
	}...)

	rej := [][]expr.Any{
		cat(nftable.CtDNAT(expr.CmpOpNeq), []expr.Any{nftable.Verdict(expr.VerdictReturn, "")}),
		cat(nftable.IsTCP(true), fe, []expr.Any{lookup(SetNoEndpoints), nftable.RejectTCP()}),
		cat(nftable.IsTCP(false), fe, []expr.Any{lookup(SetNoEndpoints), nftable.RejectICMP(l.Family)}),
	}
	for _, m := range localNodePort {
		rej = append(rej,
			cat(m, nftable.IsTCP(true), np, []expr.Any{lookup(SetNodePortNoEndpoints), nftable.RejectTCP()}),
			cat(m, nftable.IsTCP(false), np, []expr.Any{lookup(SetNodePortNoEndpoints), nftable.RejectICMP(l.Family)}))
	}
	r[chainReject] = rej
	r[chainFilterIn] = jump(chainReject)
	r[chainFilterOut] = jump(chainReject)
	r[chainFilterFwd] = jump(chainReject)
	return r
}

func (k *netlinkKernel) Setup(ctx context.Context, l Layout, rewrite bool) (bool, error) {
	return k.c.Setup(ctx, table(l), rewrite)
}

func (k *netlinkKernel) Elements(ctx context.Context, fam netfilter.Family, set string) (Elements, error) {
	return k.c.Elements(ctx, nftable.Table{Name: Table, Family: fam, Sets: []*nft.Set{setOf(fam, set)}}, set)
}

func (k *netlinkKernel) Update(ctx context.Context, fam netfilter.Family, del, add []Element) error {
	t := nftable.Table{Name: Table, Family: fam}
	seen := map[string]bool{}
	for _, es := range [][]Element{del, add} {
		for _, e := range es {
			if !seen[e.Set] {
				seen[e.Set] = true
				t.Sets = append(t.Sets, setOf(fam, e.Set))
			}
		}
	}
	return k.c.Update(ctx, t, del, add)
}

func (k *netlinkKernel) Delete(ctx context.Context, fam netfilter.Family) error {
	return k.c.Delete(ctx, fam, Table)
}

// Probe writes the whole layout in a throwaway table and deletes it.
func (k *netlinkKernel) Probe(ctx context.Context, fam netfilter.Family) error {
	l := Layout{Family: fam, Mark: DefaultMark, NodePorts: true, AffinityTimeouts: []uint32{10800}}
	return k.c.Probe(ctx, table(l))
}
