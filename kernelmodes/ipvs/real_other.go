//go:build !linux

package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"

	"github.com/vishvananda/netns"
)

// unsupported says what needs Linux.
func unsupported(what string) error {
	return fmt.Errorf("%s: %w on %s", what, errors.ErrUnsupported, runtime.GOOS)
}

// Available fails: IPVS is a Linux kernel feature.
func Available() error { return fmt.Errorf("%w: %w", ErrUnavailable, unsupported("the IPVS mode")) }

// NewIPVS fails: there is no IPVS netlink family here.
func NewIPVS() (IPVS, error) { return nil, unsupported("opening IPVS netlink socket") }

// NewConntrack returns a Conntrack whose every call fails: there is no
// ctnetlink here. Mode never reaches it, as NewLinks fails first.
func NewConntrack(netns.NsHandle) Conntrack { return noConntrack{} }

type noConntrack struct{}

func (noConntrack) ClearUDP(context.Context, netip.Addr, uint16, netip.AddrPort) error {
	return unsupported("opening ctnetlink socket")
}
