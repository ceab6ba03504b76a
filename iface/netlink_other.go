//go:build !linux

package iface

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"

	"github.com/vishvananda/netns"
)

// Netlink is rtnetlink's: there is none here. New fails, so no Netlink
// exists; its methods fail the same way.
type Netlink struct{}

func unsupported() error {
	return fmt.Errorf("opening rtnetlink socket: %w on %s", errors.ErrUnsupported, runtime.GOOS)
}

// New fails: there is no rtnetlink here.
func New(netns.NsHandle) (*Netlink, error) { return nil, unsupported() }

// Close does nothing.
func (*Netlink) Close() {}

// EnsureDummy fails.
func (*Netlink) EnsureDummy(context.Context, string) error { return unsupported() }

// DeleteLink fails.
func (*Netlink) DeleteLink(context.Context, string) error { return unsupported() }

// Addrs fails.
func (*Netlink) Addrs(context.Context, string) ([]netip.Addr, error) { return nil, unsupported() }

// AddAddr fails.
func (*Netlink) AddAddr(context.Context, string, netip.Addr) error { return unsupported() }

// DelAddr fails.
func (*Netlink) DelAddr(context.Context, string, netip.Addr) error { return unsupported() }

// NodeAddrs fails.
func (*Netlink) NodeAddrs(context.Context, string) ([]netip.Addr, error) { return nil, unsupported() }
