//go:build !linux

package conntrack

import (
	"context"
	"errors"
	"fmt"

	"github.com/svcproxy/svcproxy/netfilter"
)

// Netlink is the real Table where Linux's ctnetlink exists; here each call
// fails.
type Netlink struct{}

var _ Table = (*Netlink)(nil)

// NewNetlink returns a Table whose every call fails: this system has no
// ctnetlink.
func NewNetlink(ns string) *Netlink { return &Netlink{} }

// Delete implements Table.
func (*Netlink) Delete(context.Context, netfilter.Family, func(Flow) bool) (int, error) {
	return 0, fmt.Errorf("deleting conntrack entries: %w", errors.ErrUnsupported)
}
