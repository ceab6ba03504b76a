//go:build !linux

package nftables

import (
	"context"
	"errors"

	"github.com/svcproxy/svcproxy/netfilter"
)

// netlinkKernel: nf_tables is Linux's.
type netlinkKernel struct{}

func newNetlinkKernel(string) Kernel { return netlinkKernel{} }

var errNotLinux = errors.New("nftables needs Linux")

func (netlinkKernel) Setup(context.Context, Layout, bool) (bool, error) { return false, errNotLinux }
func (netlinkKernel) Elements(context.Context, netfilter.Family, string) (Elements, error) {
	return nil, errNotLinux
}
func (netlinkKernel) Update(context.Context, netfilter.Family, []Element, []Element) error {
	return errNotLinux
}
func (netlinkKernel) Delete(context.Context, netfilter.Family) error { return nil }
func (netlinkKernel) Probe(context.Context, netfilter.Family) error  { return errNotLinux }
