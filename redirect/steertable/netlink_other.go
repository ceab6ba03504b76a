//go:build !linux

package steertable

import (
	"context"
	"errors"

	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/nftable"
)

// netlinkKernel: nf_tables is Linux's.
type netlinkKernel struct{}

func newNetlink(string) Kernel { return netlinkKernel{} }

var errNotLinux = errors.New("nftables needs Linux")

func (netlinkKernel) Setup(context.Context, Layout) (bool, error) { return false, errNotLinux }
func (netlinkKernel) Elements(context.Context, netfilter.Family, string) (map[string]string, error) {
	return nil, errNotLinux
}
func (netlinkKernel) Update(context.Context, netfilter.Family, []nftable.Element, []nftable.Element) error {
	return errNotLinux
}
func (netlinkKernel) Delete(context.Context, netfilter.Family) error { return nil }
func (netlinkKernel) Probe(context.Context, Layout) error            { return errNotLinux }
