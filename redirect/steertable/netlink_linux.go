package steertable

import (
	"context"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/nftable"
)

type netlinkKernel struct{ c *nftable.Conn }

func newNetlink(ns string) Kernel { return &netlinkKernel{c: nftable.NewConn(ns)} }

// setOf is set's definition in a table of fam.
func setOf(fam netfilter.Family, set string) *nft.Set {
	a := nftable.AddrType(fam)
	s := &nft.Set{Name: set, Concatenation: true}
	switch set {
	case SetFrontends, SetShortCircuit:
		s.IsMap = true
		s.KeyType = nft.MustConcatSetType(a, nft.TypeInetProto, nft.TypeInetService)
		s.DataType = nft.TypeInetService
	case SetNodePorts, SetNodePortShortCircuit:
		s.IsMap = true
		s.KeyType = nft.MustConcatSetType(nft.TypeInetProto, nft.TypeInetService)
		s.DataType = nft.TypeInetService
	case SetNoEndpoints:
		s.KeyType = nft.MustConcatSetType(a, nft.TypeInetProto, nft.TypeInetService)
	case SetNodePortNoEndpoints:
		s.KeyType = nft.MustConcatSetType(nft.TypeInetProto, nft.TypeInetService)
	case SetUDPSockets:
		s.Concatenation = false
		s.KeyType = nft.TypeInetService
	}
	return s
}

// The chains of each table.
const (
	chainSteer      = "steer"     // redirect frontends; NodePorts on local addresses
	chainNodePorts  = "nodeports" // redirect NodePorts
	chainReject     = "reject"    // reject what has no endpoints, drop direct UDP
	chainPrerouting = "nat-prerouting"
	chainOutput     = "nat-output"
	chainFilterIn   = "filter-input"
	chainFilterOut  = "filter-output"
	chainFilterFwd  = "filter-forward"
)

func chains() []*nft.Chain {
	base := func(name string, typ nft.ChainType, hook *nft.ChainHook, prio *nft.ChainPriority) *nft.Chain {
		return &nft.Chain{Name: name, Type: typ, Hooknum: hook, Priority: prio}
	}
	return []*nft.Chain{
		{Name: chainSteer}, {Name: chainNodePorts}, {Name: chainReject},
		base(chainPrerouting, nft.ChainTypeNAT, nft.ChainHookPrerouting, nft.ChainPriorityNATDest),
		base(chainOutput, nft.ChainTypeNAT, nft.ChainHookOutput, nft.ChainPriorityNATDest),
		base(chainFilterIn, nft.ChainTypeFilter, nft.ChainHookInput, nft.ChainPriorityFilter),
		base(chainFilterOut, nft.ChainTypeFilter, nft.ChainHookOutput, nft.ChainPriorityFilter),
		base(chainFilterFwd, nft.ChainTypeFilter, nft.ChainHookForward, nft.ChainPriorityFilter),
	}
}

// regTo holds the address a DNAT to Layout.To goes to: NFT_REG_2, loaded
// after the map lookup (whose key may have spanned it) left the port in
// Reg1.
const regTo = 2

// steer sends a packet to the forwarder port a map lookup left in Reg1: a
// redirect, or with l.To a DNAT to that node address.
func steer(l Layout) []expr.Any {
	if !l.To.IsValid() {
		return []expr.Any{&expr.Redir{RegisterProtoMin: nftable.Reg1, RegisterProtoMax: nftable.Reg1}}
	}
	family := uint32(unix.NFPROTO_IPV4)
	if l.Family == netfilter.IPv6 {
		family = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Immediate{Register: regTo, Data: l.To.AsSlice()},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: family, RegAddrMin: regTo, RegAddrMax: regTo,
			RegProtoMin: nftable.Reg1, RegProtoMax: nftable.Reg1, Specified: true},
	}
}

// rules are the rules of each chain for l (see the package doc).
func rules(l Layout) map[string][][]expr.Any {
	cat, lookup := nftable.Cat, nftable.Lookup
	ret := []expr.Any{nftable.Verdict(expr.VerdictReturn, "")}
	fe, _ := nftable.Frontend(l.Family)
	np, _ := nftable.NodePort()
	var local [][]expr.Any
	if l.NodePorts {
		local = nftable.LocalDest(l.Family, l.NodePortPrefixes, true)
	}
	// Clients inside the cluster: the pods' prefixes, and the node.
	inside := [][]expr.Any{{
		&expr.Fib{Register: nftable.Reg1, FlagSADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: nftable.Reg1, Data: nftable.Native32(unix.RTN_LOCAL)},
	}}
	for _, p := range l.ClusterCIDRs {
		inside = append(inside, cat([]expr.Any{nftable.LoadAddr(l.Family, false, nftable.Reg1)}, nftable.InPrefix(l.Family, p, true)))
	}
	r := map[string][][]expr.Any{}
	r[chainSteer] = [][]expr.Any{
		cat(nftable.Marked(l.Mark, true), ret),
		cat(fe, []expr.Any{nftable.MapTo(SetFrontends)}, steer(l)),
	}
	r[chainNodePorts] = [][]expr.Any{cat(np, []expr.Any{nftable.MapTo(SetNodePorts)}, steer(l))}
	for _, src := range inside {
		r[chainSteer] = append(r[chainSteer], cat(src, fe, []expr.Any{nftable.MapTo(SetShortCircuit)}, steer(l)))
		r[chainNodePorts] = append(r[chainNodePorts], cat(src, np, []expr.Any{nftable.MapTo(SetNodePortShortCircuit)}, steer(l)))
	}
	r[chainSteer] = append(r[chainSteer], cat(fe, []expr.Any{lookup(SetNoEndpoints)}, ret))
	for _, m := range local {
		r[chainSteer] = append(r[chainSteer], cat(m, []expr.Any{nftable.Verdict(expr.VerdictJump, chainNodePorts)}))
	}
	jump := func(chain string) [][]expr.Any { return [][]expr.Any{{nftable.Verdict(expr.VerdictJump, chain)}} }
	r[chainPrerouting] = jump(chainSteer)
	r[chainOutput] = jump(chainSteer)

	rej := [][]expr.Any{
		cat(nftable.Marked(l.Mark, true), ret),
		cat(nftable.CtDNAT(expr.CmpOpNeq), ret),
		cat(nftable.IsTCP(true), fe, []expr.Any{lookup(SetNoEndpoints), nftable.RejectTCP()}),
		cat(nftable.IsTCP(false), fe, []expr.Any{lookup(SetNoEndpoints), nftable.RejectICMP(l.Family)}),
	}
	for _, m := range local {
		rej = append(rej,
			cat(m, nftable.IsTCP(true), np, []expr.Any{lookup(SetNodePortNoEndpoints), nftable.RejectTCP()}),
			cat(m, nftable.IsTCP(false), np, []expr.Any{lookup(SetNodePortNoEndpoints), nftable.RejectICMP(l.Family)}))
	}
	udpPort := &expr.Payload{DestRegister: nftable.Reg1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
	rej = append(rej, cat(nftable.LocalDest(l.Family, nil, true)[0], nftable.IsProto(17, true),
		[]expr.Any{udpPort, lookup(SetUDPSockets), nftable.Verdict(expr.VerdictDrop, "")}))
	r[chainReject] = rej
	r[chainFilterIn] = jump(chainReject)
	r[chainFilterOut] = jump(chainReject)
	r[chainFilterFwd] = jump(chainReject)
	return r
}

// table is l's table as nftable declares it.
func table(l Layout) nftable.Table {
	t := declared(l.Family)
	t.Chains, t.Rules = chains(), rules(l)
	return t
}

// declared is fam's table as far as element reads and writes need it: its
// sets, not its rules (built for every change otherwise).
func declared(fam netfilter.Family) nftable.Table {
	t := nftable.Table{Name: Table, Family: fam}
	for _, name := range Sets {
		t.Sets = append(t.Sets, setOf(fam, name))
	}
	return t
}

func (k *netlinkKernel) Setup(ctx context.Context, l Layout) (bool, error) {
	return k.c.Setup(ctx, table(l), true)
}

func (k *netlinkKernel) Elements(ctx context.Context, fam netfilter.Family, set string) (map[string]string, error) {
	return k.c.Elements(ctx, declared(fam), set)
}

func (k *netlinkKernel) Update(ctx context.Context, fam netfilter.Family, del, add []nftable.Element) error {
	return k.c.Update(ctx, declared(fam), del, add)
}

func (k *netlinkKernel) Delete(ctx context.Context, fam netfilter.Family) error {
	return k.c.Delete(ctx, fam, Table)
}

// Close closes the netlink socket (the next call opens another).
func (k *netlinkKernel) Close() error { return k.c.Close() }

func (k *netlinkKernel) Probe(ctx context.Context, l Layout) error {
	return k.c.Probe(ctx, table(l))
}
