package nftables

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/netfilter"
)

// netlinkKernel is Kernel over nf_tables netlink (github.com/google/nftables:
// no nft process, no parsing, no cache of the ruleset; see the package doc
// for the measurement that chose it). Each call opens its own socket, in
// the named network namespace ns ("": the process's).
type netlinkKernel struct {
	ns string
	mu sync.Mutex
	c  *nft.Conn
}

// Netlink caps an attribute at 64 KiB and a batch at the socket's send
// buffer: elements go 64 to a message and about 2,000 to a batch.
const (
	elementsPerMessage = 64
	elementsPerBatch   = 2000
)

func tableOf(fam netfilter.Family) *nft.Table {
	f := nft.TableFamilyIPv4
	if fam == netfilter.IPv6 {
		f = nft.TableFamilyIPv6
	}
	return &nft.Table{Name: Table, Family: f}
}

func addrType(fam netfilter.Family) nft.SetDatatype {
	if fam == netfilter.IPv6 {
		return nft.TypeIP6Addr
	}
	return nft.TypeIPAddr
}

// setOf is set's definition in fam's table.
func setOf(fam netfilter.Family, set string) *nft.Set {
	a := addrType(fam)
	s := &nft.Set{Table: tableOf(fam), Name: set, Concatenation: true}
	switch set {
	case SetServiceEndpoints:
		s.IsMap = true
		s.KeyType = nft.MustConcatSetType(a, nft.TypeInetProto, nft.TypeInetService, nft.TypeMark)
		s.DataType = nft.MustConcatSetType(a, nft.TypeInetService)
	case SetNodePortEndpoints:
		s.IsMap = true
		s.KeyType = nft.MustConcatSetType(nft.TypeInetProto, nft.TypeInetService, nft.TypeMark)
		s.DataType = nft.MustConcatSetType(a, nft.TypeInetService)
	case SetNoEndpoints, SetMasquerade, SetMasqueradeOffCluster:
		s.KeyType = nft.MustConcatSetType(a, nft.TypeInetProto, nft.TypeInetService)
	case SetNodePortNoEndpoints, SetNodePortMasquerade:
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
)

var chainNames = []string{chainServices, chainNodePorts, chainReject, chainPrerouting, chainOutput, chainPostrouting, chainFilterIn, chainFilterOut, chainFilterFwd}

func chainsOf(t *nft.Table) map[string]*nft.Chain {
	base := func(name string, typ nft.ChainType, hook *nft.ChainHook, prio *nft.ChainPriority) *nft.Chain {
		return &nft.Chain{Name: name, Table: t, Type: typ, Hooknum: hook, Priority: prio}
	}
	return map[string]*nft.Chain{
		chainServices:    {Name: chainServices, Table: t},
		chainNodePorts:   {Name: chainNodePorts, Table: t},
		chainReject:      {Name: chainReject, Table: t},
		chainPrerouting:  base(chainPrerouting, nft.ChainTypeNAT, nft.ChainHookPrerouting, nft.ChainPriorityNATDest),
		chainOutput:      base(chainOutput, nft.ChainTypeNAT, nft.ChainHookOutput, nft.ChainPriorityNATDest),
		chainPostrouting: base(chainPostrouting, nft.ChainTypeNAT, nft.ChainHookPostrouting, nft.ChainPriorityNATSource),
		chainFilterIn:    base(chainFilterIn, nft.ChainTypeFilter, nft.ChainHookInput, nft.ChainPriorityFilter),
		chainFilterOut:   base(chainFilterOut, nft.ChainTypeFilter, nft.ChainHookOutput, nft.ChainPriorityFilter),
		chainFilterFwd:   base(chainFilterFwd, nft.ChainTypeFilter, nft.ChainHookForward, nft.ChainPriorityFilter),
	}
}

// Registers: a concatenation's fields sit in consecutive 32-bit registers
// from NFT_REG32_00 (8), which NFT_REG_1 (1) also names.
const (
	reg1    = 1
	reg32   = 8
	ipsDNAT = 0x20 // IPS_DST_NAT
)

// rb builds the expressions of one family's rules.
type rb struct {
	l   Layout
	fam netfilter.Family
}

func (b rb) alen() uint32 { return uint32(addrLen(b.fam)) }

// addrOffset is the offset of the source or destination address in the
// network header.
func (b rb) addrOffset(dst bool) uint32 {
	switch {
	case b.fam == netfilter.IPv6 && dst:
		return 24
	case b.fam == netfilter.IPv6:
		return 8
	case dst:
		return 16
	}
	return 12
}

func (b rb) loadAddr(dst bool, reg uint32) expr.Any {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: b.addrOffset(dst), Len: b.alen()}
}

// frontend loads daddr . l4proto . dport from reg1 on and returns the next
// free 32-bit register.
func (b rb) frontend() ([]expr.Any, uint32) {
	next := reg32 + b.alen()/4
	return []expr.Any{
		b.loadAddr(true, reg1),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: next},
		&expr.Payload{DestRegister: next + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
	}, next + 2
}

// nodePort loads l4proto . dport from reg1 on.
func nodePort() ([]expr.Any, uint32) {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Payload{DestRegister: reg32 + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
	}, reg32 + 2
}

func lookup(set string) expr.Any { return &expr.Lookup{SourceRegister: reg1, SetName: set} }

func native32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

// setMark sets the masquerade mark bits, keeping the others.
func (b rb) setMark() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: native32(^b.l.Mark), Xor: native32(b.l.Mark)},
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

func numgen(reg uint32) expr.Any {
	return &expr.Numgen{Register: reg, Modulus: Slots, Type: unix.NFT_NG_RANDOM}
}

// inPrefix matches (or, not, fails to match) the address in reg1 against p.
func (b rb) inPrefix(p netip.Prefix, in bool) []expr.Any {
	mask := make([]byte, b.alen())
	for i := range p.Bits() {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	op := expr.CmpOpEq
	if !in {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: b.alen(), Mask: mask, Xor: make([]byte, b.alen())},
		&expr.Cmp{Op: op, Register: reg1, Data: p.Masked().Addr().AsSlice()},
	}
}

// localNodePort matches a destination that is a local address, not
// loopback, and (one rule each) inside one of the NodePort prefixes.
func (b rb) localNodePort() [][]expr.Any {
	lo := netip.MustParsePrefix("127.0.0.0/8")
	if b.fam == netfilter.IPv6 {
		lo = netip.MustParsePrefix("::1/128")
	}
	head := []expr.Any{
		&expr.Fib{Register: reg1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: native32(unix.RTN_LOCAL)},
		b.loadAddr(true, reg1),
	}
	head = append(head, b.inPrefix(lo, false)...)
	if len(b.l.NodePortPrefixes) == 0 {
		return [][]expr.Any{head}
	}
	var out [][]expr.Any
	for _, p := range b.l.NodePortPrefixes {
		r := append([]expr.Any{}, head...)
		r = append(r, b.loadAddr(true, reg1))
		out = append(out, append(r, b.inPrefix(p, true)...))
	}
	return out
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
		&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: SetAffinity},
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
	front := append(append([]expr.Any{}, dnated...), ctDst, proto, ctPort, lookup(AffinitySet(secs)))
	np := append(append([]expr.Any{}, dnated...),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Ct{Key: expr.CtKeyPROTODST, Register: reg32 + 1},
		lookup(AffinityNodePortSet(secs)))
	return [][]expr.Any{append(front, update...), append(np, update...)}
}

func verdict(kind expr.VerdictKind, chain string) expr.Any {
	return &expr.Verdict{Kind: kind, Chain: chain}
}

func (b rb) rejectICMP() expr.Any {
	if b.fam == netfilter.IPv6 {
		return &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 4} // ICMPV6 port unreachable
	}
	return &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 3} // ICMP port unreachable
}

func isTCP(eq bool) []expr.Any {
	op := expr.CmpOpEq
	if !eq {
		op = expr.CmpOpNeq
	}
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1}, &expr.Cmp{Op: op, Register: reg1, Data: []byte{unix.IPPROTO_TCP}}}
}

// rules are the rules of each chain for l (see the package doc).
func rules(l Layout) map[string][][]expr.Any {
	b := rb{l: l, fam: l.Family}
	cat := func(parts ...[]expr.Any) []expr.Any {
		var out []expr.Any
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	fe, feNext := b.frontend()
	np, npNext := nodePort()
	r := map[string][][]expr.Any{}

	// services: mark what is masqueraded, then DNAT a frontend, else
	// hand local addresses to the NodePorts.
	r[chainServices] = append(r[chainServices], cat(fe, []expr.Any{lookup(SetMasquerade)}, b.setMark()))
	if l.ClusterCIDR.IsValid() {
		r[chainServices] = append(r[chainServices], cat([]expr.Any{b.loadAddr(false, reg1)}, b.inPrefix(l.ClusterCIDR, false),
			fe, []expr.Any{lookup(SetMasqueradeOffCluster)}, b.setMark()))
	}
	if len(l.AffinityTimeouts) > 0 {
		r[chainServices] = append(r[chainServices], b.remembered())
	}
	r[chainServices] = append(r[chainServices], cat(fe, []expr.Any{numgen(feNext),
		&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: SetServiceEndpoints}, b.dnat()}))
	if l.NodePorts {
		for _, m := range b.localNodePort() {
			r[chainServices] = append(r[chainServices], cat(m, []expr.Any{verdict(expr.VerdictJump, chainNodePorts)}))
		}
	}
	r[chainNodePorts] = [][]expr.Any{cat(np, []expr.Any{lookup(SetNodePortMasquerade)}, b.setMark())}
	if len(l.AffinityTimeouts) > 0 {
		r[chainNodePorts] = append(r[chainNodePorts], b.remembered())
	}
	r[chainNodePorts] = append(r[chainNodePorts],
		cat(np, []expr.Any{numgen(npNext), &expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: SetNodePortEndpoints}, b.dnat()}))
	jump := func(chain string) [][]expr.Any { return [][]expr.Any{{verdict(expr.VerdictJump, chain)}} }
	r[chainPrerouting] = jump(chainServices)
	r[chainOutput] = jump(chainServices)

	ctDNAT := func(op expr.CmpOp) []expr.Any {
		return []expr.Any{
			&expr.Ct{Key: expr.CtKeySTATUS, Register: reg1},
			&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: native32(ipsDNAT), Xor: native32(0)},
			&expr.Cmp{Op: op, Register: reg1, Data: native32(0)},
		}
	}
	masq := &expr.Masq{FullyRandom: true}
	for _, secs := range l.AffinityTimeouts {
		r[chainPostrouting] = append(r[chainPostrouting], b.remember(ctDNAT(expr.CmpOpNeq), secs)...)
	}
	r[chainPostrouting] = append(r[chainPostrouting], [][]expr.Any{
		// Hairpin: DNATed back to its own source.
		cat(ctDNAT(expr.CmpOpNeq), []expr.Any{b.loadAddr(false, reg1), b.loadAddr(true, reg32+b.alen()/4), lookup(SetHairpin), masq}),
		{&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
			&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: native32(l.Mark), Xor: native32(0)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: native32(0)}, verdict(expr.VerdictReturn, "")},
		{&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
			&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: native32(^l.Mark), Xor: native32(0)},
			&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1, SourceRegister: true}, masq},
	}...)

	rej := [][]expr.Any{
		cat(ctDNAT(expr.CmpOpNeq), []expr.Any{verdict(expr.VerdictReturn, "")}),
		cat(isTCP(true), fe, []expr.Any{lookup(SetNoEndpoints), &expr.Reject{Type: unix.NFT_REJECT_TCP_RST}}),
		cat(isTCP(false), fe, []expr.Any{lookup(SetNoEndpoints), b.rejectICMP()}),
	}
	if l.NodePorts {
		for _, m := range b.localNodePort() {
			rej = append(rej,
				cat(m, isTCP(true), np, []expr.Any{lookup(SetNodePortNoEndpoints), &expr.Reject{Type: unix.NFT_REJECT_TCP_RST}}),
				cat(m, isTCP(false), np, []expr.Any{lookup(SetNodePortNoEndpoints), b.rejectICMP()}))
		}
	}
	r[chainReject] = rej
	r[chainFilterIn] = jump(chainReject)
	r[chainFilterOut] = jump(chainReject)
	r[chainFilterFwd] = jump(chainReject)
	return r
}

// conn returns k's netlink socket, opening it (in k's namespace) if it is
// not open. One socket serves every call: opening and closing one per
// transaction cost 12-15 ms a change here, most of an endpoint change. The
// caller holds k.mu.
func (k *netlinkKernel) conn() (*nft.Conn, error) {
	if k.c != nil {
		return k.c, nil
	}
	opts := []nft.ConnOption{nft.AsLasting()}
	if k.ns != "" {
		f, err := os.Open("/run/netns/" + k.ns)
		if err != nil {
			return nil, fmt.Errorf("opening network namespace %s: %w", k.ns, err)
		}
		defer f.Close() // the socket keeps its namespace
		opts = append(opts, nft.WithNetNSFd(int(f.Fd())))
	}
	c, err := nft.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("opening an nf_tables netlink socket: %w", err)
	}
	k.c = c
	return c, nil
}

// dial locks k and returns its socket; done unlocks, first closing the
// socket if the call failed (a batch half sent or a broken socket is not
// reused).
func (k *netlinkKernel) dial() (*nft.Conn, func(*error), error) {
	k.mu.Lock()
	c, err := k.conn()
	if err != nil {
		k.mu.Unlock()
		return nil, nil, err
	}
	return c, func(err *error) {
		if *err != nil {
			_ = k.c.CloseLasting()
			k.c = nil
		}
		k.mu.Unlock()
	}, nil
}

// Setup checks what is there, then adds the table, sets and chains (a no-op
// for those that exist), flushes the chains and writes their rules, in one
// transaction. A set that exists with another type (an older layout) makes
// it start over with a new table.
func (k *netlinkKernel) Setup(ctx context.Context, l Layout) (intact bool, err error) {
	c, done, err := k.dial()
	if err != nil {
		return false, err
	}
	defer done(&err)
	t := tableOf(l.Family)
	want := rules(l)
	names := append(l.ElementSets(), SetAffinity)
	var stale []string // affinity sets of timeouts no Service has any more
	intact = true
	if _, err := c.ListTableOfFamily(Table, t.Family); err != nil {
		intact = false
	} else {
		sets, err := c.GetSets(t)
		if err != nil {
			return false, fmt.Errorf("listing sets: %w", err)
		}
		have := map[string]*nft.Set{}
		for _, s := range sets {
			have[s.Name] = s
		}
		for name := range have {
			if strings.HasPrefix(name, "affinity-") && !slices.Contains(names, name) {
				stale = append(stale, name)
				intact = false
			}
		}
		for _, name := range names {
			s, w := have[name], setOf(l.Family, name)
			if s == nil {
				intact = false
				continue
			}
			if s.KeyType.Bytes != w.KeyType.Bytes || s.IsMap != w.IsMap || (s.IsMap && s.DataType.Bytes != w.DataType.Bytes) {
				// An older layout: start over.
				c.DelTable(t)
				if err := c.Flush(); err != nil {
					return false, fmt.Errorf("deleting a table of another layout: %w", err)
				}
				intact, stale = false, nil
				break
			}
		}
		if intact {
			for name, ch := range chainsOf(t) {
				rs, err := c.GetRules(t, ch)
				if err != nil || len(rs) != len(want[name]) {
					intact = false
					break
				}
			}
		}
	}
	c.AddTable(t)
	for _, name := range names {
		if err := c.AddSet(setOf(l.Family, name), nil); err != nil {
			return false, fmt.Errorf("adding set %s: %w", name, err)
		}
	}
	chains := chainsOf(t)
	for _, name := range chainNames {
		c.AddChain(chains[name])
	}
	for _, name := range chainNames {
		c.FlushChain(chains[name])
	}
	for _, name := range stale { // no rule refers to them once the chains are flushed
		c.DelSet(&nft.Set{Table: t, Name: name})
	}
	for _, name := range chainNames {
		for _, ex := range want[name] {
			c.AddRule(&nft.Rule{Table: t, Chain: chains[name], Exprs: ex})
		}
	}
	if err := c.Flush(); err != nil {
		return false, fmt.Errorf("writing table %s: %w", Table, err)
	}
	return intact, nil
}

func (k *netlinkKernel) Elements(ctx context.Context, fam netfilter.Family, set string) (_ Elements, err error) {
	c, done, err := k.dial()
	if err != nil {
		return nil, err
	}
	defer done(&err)
	s := setOf(fam, set)
	got, err := c.GetSetElements(s)
	if err != nil {
		return nil, err
	}
	out := make(Elements, len(got))
	for _, e := range got {
		out[string(e.Key)] = string(e.Val)
	}
	return out, nil
}

func (k *netlinkKernel) Update(ctx context.Context, fam netfilter.Family, del, add []Element) (err error) {
	if len(del)+len(add) == 0 {
		return nil
	}
	c, done, err := k.dial()
	if err != nil {
		return err
	}
	defer done(&err)
	pending := 0
	write := func(es []Element, f func(*nft.Set, []nft.SetElement) error) error {
		for len(es) > 0 {
			set := es[0].Set
			n := 0
			var batch []nft.SetElement
			for n < len(es) && es[n].Set == set && n < elementsPerMessage {
				batch = append(batch, nft.SetElement{Key: []byte(es[n].Key), Val: []byte(es[n].Val)})
				n++
			}
			es = es[n:]
			if err := f(setOf(fam, set), batch); err != nil {
				return err
			}
			if pending += n; pending >= elementsPerBatch {
				if err := c.Flush(); err != nil {
					return err
				}
				pending = 0
			}
		}
		return nil
	}
	if err := write(del, c.SetDeleteElements); err != nil {
		return fmt.Errorf("deleting elements: %w", err)
	}
	if err := write(add, c.SetAddElements); err != nil {
		return fmt.Errorf("adding elements: %w", err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("writing elements: %w", err)
	}
	return nil
}

func (k *netlinkKernel) Delete(ctx context.Context, fam netfilter.Family) (err error) {
	c, done, err := k.dial()
	if err != nil {
		return err
	}
	defer done(&err)
	t := tableOf(fam)
	if _, err := c.ListTableOfFamily(Table, t.Family); err != nil {
		return nil // not there
	}
	c.DelTable(t)
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Probe writes the whole layout in a throwaway table and deletes it.
func (k *netlinkKernel) Probe(ctx context.Context, fam netfilter.Family) (err error) {
	c, done, err := k.dial()
	if err != nil {
		return err
	}
	defer done(&err)
	t := tableOf(fam)
	t.Name = Table + "-probe"
	l := Layout{Family: fam, Mark: DefaultMark, NodePorts: true, AffinityTimeouts: []uint32{10800}}
	c.AddTable(t)
	for _, name := range append(l.ElementSets(), SetAffinity) {
		s := setOf(fam, name)
		s.Table = t
		if err := c.AddSet(s, nil); err != nil {
			return err
		}
	}
	chains := chainsOf(t)
	for _, name := range chainNames {
		c.AddChain(chains[name])
	}
	for name, rs := range rules(l) {
		for _, ex := range rs {
			c.AddRule(&nft.Rule{Table: t, Chain: chains[name], Exprs: ex})
		}
	}
	err = c.Flush()
	c.DelTable(t)
	if derr := c.Flush(); err == nil && derr != nil {
		err = derr
	}
	if err != nil {
		return fmt.Errorf("writing a table of the mode's layout: %w", err)
	}
	return nil
}
