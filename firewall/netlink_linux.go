package firewall

import (
	"context"
	"errors"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/nftable"
)

type netlinkKernel struct{ c *nftable.Conn }

func newNetlink(ns string) Kernel { return &netlinkKernel{c: nftable.NewConn(ns)} }

// The chains of each table.
const (
	chainCheck      = "check"
	chainPrerouting = "filter-prerouting"
	chainOutput     = "filter-output"
)

// layout is fam's table beyond its elements.
func layout(fam netfilter.Family) nftable.Table {
	a := nftable.AddrType(fam)
	prio := nft.ChainPriorityRef(*nft.ChainPriorityNATDest - 10)
	frontend, next := nftable.Frontend(fam)
	check := append(frontend,
		nftable.Lookup(SetFirewalled),
		nftable.LoadAddr(fam, false, next),
		&expr.Lookup{SourceRegister: nftable.Reg1, SetName: SetAllowed, Invert: true},
		&expr.Counter{},
		nftable.Verdict(expr.VerdictDrop, ""),
	)
	jump := [][]expr.Any{{nftable.Verdict(expr.VerdictJump, chainCheck)}}
	return nftable.Table{
		Name:   Table,
		Family: fam,
		Sets: []*nft.Set{
			{Name: SetFirewalled, Concatenation: true, KeyType: nft.MustConcatSetType(a, nft.TypeInetProto, nft.TypeInetService)},
			{Name: SetAllowed, Concatenation: true, Interval: true, KeyType: nft.MustConcatSetType(a, nft.TypeInetProto, nft.TypeInetService, a)},
		},
		Chains: []*nft.Chain{
			{Name: chainCheck},
			{Name: chainPrerouting, Type: nft.ChainTypeFilter, Hooknum: nft.ChainHookPrerouting, Priority: prio},
			{Name: chainOutput, Type: nft.ChainTypeFilter, Hooknum: nft.ChainHookOutput, Priority: prio},
		},
		Rules: map[string][][]expr.Any{
			chainCheck:      {check},
			chainPrerouting: jump,
			chainOutput:     jump,
		},
	}
}

func (k *netlinkKernel) Write(ctx context.Context, fam netfilter.Family, elems []nftable.Element) error {
	return k.c.Replace(ctx, layout(fam), elems)
}

func (k *netlinkKernel) Delete(ctx context.Context, fam netfilter.Family) error {
	if err := k.c.Delete(ctx, fam, Table); err != nil && !noNFTables(err) {
		return err
	}
	return nil
}

// noNFTables says err is the kernel having no nf_tables at all (no netlink
// protocol for it, as in a kernel built without it or with its module not
// loaded): then there is no table to delete either, and a node that
// restricts nothing must not fail for it.
func noNFTables(err error) bool {
	return errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.EAFNOSUPPORT)
}
