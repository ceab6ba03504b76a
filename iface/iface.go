// Package iface owns svcproxy's view of the node's network interfaces: the
// dummy interface that holds Service virtual IPs as local addresses of the
// node (the IPVS mode's, and the userspace mode's with --steering=local,
// as kube-proxy's IPVS mode holds them on kube-ipvs0), and reading the
// node's own addresses. Netlink is the real implementation, over
// rtnetlink; Links is what both consumers call, and ipvstest.Links its
// in-memory fake. LocalAddrs is the node's addresses kept current from
// rtnetlink's notifications (WatchLocalAddrs), for the forwarder to tell
// the node's own connections as the kernel's "src-type LOCAL" does; its
// consumer takes it as a func, which tests replace.
package iface

import (
	"context"
	"errors"
	"net/netip"
)

// ErrNoLink: the network interface does not exist.
var ErrNoLink = errors.New("no such interface")

// Links manages the dummy interface that holds the virtual IPs and reads the
// node's addresses. The IPVS mode and local steering call all of it.
type Links interface {
	// EnsureDummy creates the dummy interface name unless it exists. It is
	// left down: the kernel still adds a local route for each address on
	// it, which is all IPVS needs to see packets to them, and all a
	// socket needs to bind them.
	EnsureDummy(ctx context.Context, name string) error
	// DeleteLink deletes interface name; a missing one is not an error.
	DeleteLink(ctx context.Context, name string) error
	// Addrs lists the addresses on interface name; ErrNoLink when it does
	// not exist.
	Addrs(ctx context.Context, name string) ([]netip.Addr, error)
	// AddAddr adds addr as a host address (/32, /128) to interface name;
	// adding one that is there is not an error.
	AddAddr(ctx context.Context, name string, addr netip.Addr) error
	// DelAddr removes addr from interface name; a missing one is not an
	// error.
	DelAddr(ctx context.Context, name string, addr netip.Addr) error
	// NodeAddrs lists the node's global unicast addresses on every
	// interface but loopback and exclude, each once.
	NodeAddrs(ctx context.Context, exclude string) ([]netip.Addr, error)
}

var _ Links = (*Netlink)(nil)
