//go:build !linux

package firewall

import (
	"context"
	"errors"

	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/nftable"
)

// netlinkKernel: nf_tables is Linux's.
type netlinkKernel struct{}

func newNetlink(string) Kernel { return netlinkKernel{} }

func (netlinkKernel) Write(context.Context, netfilter.Family, []nftable.Element) error {
	return errors.New("loadBalancerSourceRanges need nftables, which is Linux's")
}
func (netlinkKernel) Delete(context.Context, netfilter.Family) error { return nil }
