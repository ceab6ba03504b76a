package userspace

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"

	"github.com/vishvananda/netns"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/iface"
	"github.com/svcproxy/svcproxy/lb"
)

// DefaultVIPDevice is the dummy interface --steering=local puts the
// virtual IPs on (the IPVS mode's is svcproxy-ipvs0; kube-proxy's
// kube-ipvs0).
const DefaultVIPDevice = "svcproxy-vips"

// LocalVIPs configures local steering: every TCP and UDP frontend's
// virtual IP (ClusterIPs, ExternalIPs, LoadBalancer IPs) becomes a local
// address of the node on a dummy interface, as kube-proxy's IPVS mode puts
// them on kube-ipvs0, and the forwarder listens on each frontend. Packets
// to a Service reach its socket as they would a local server's: no
// steering rule, no NAT, no original destination to look up. NodePorts are
// listened on at every node address.
type LocalVIPs struct {
	// Device is the dummy interface's name; "": DefaultVIPDevice.
	Device string
	// Links manages it; nil: rtnetlink in the caller's network namespace
	// (package iface), closed with the Mode.
	Links Links
	// IPv6: the node serves IPv6. Without it a Service's IPv6 virtual IPs
	// are left off the device (the daemon warns about them once), as they
	// could not be added.
	IPv6 bool
}

// Links is what local steering calls of the node's interfaces: package
// iface's Netlink, or ipvstest.Links in tests.
type Links = iface.Links

// vips keeps the dummy interface holding exactly the snapshot's virtual
// IPs. Its owner serializes the calls.
type vips struct {
	dev   string
	links Links
	ipv6  bool
	close func() // closes the rtnetlink socket newVIPs opened; nil: none
	log   *zap.Logger
	on    map[netip.Addr]bool // on the device as last read or written; nil: read it first
	node  map[netip.Addr]bool // the node's own addresses on other interfaces, as of the last read

	count  atomic.Int64  // len(on), for metrics read without the owner's lock
	failed atomic.Uint64 // addresses that could not be added or removed
}

// counted publishes len(v.on) for metrics.
func (v *vips) counted() { v.count.Store(int64(len(v.on))) }

func newVIPs(cfg LocalVIPs, log *zap.Logger) (*vips, error) {
	v := &vips{dev: cfg.Device, links: cfg.Links, ipv6: cfg.IPv6, log: log}
	if v.dev == "" {
		v.dev = DefaultVIPDevice
	}
	if v.links == nil {
		l, err := iface.New(netns.None())
		if err != nil {
			return nil, fmt.Errorf("local steering: %w", err)
		}
		v.links, v.close = l, l.Close
	}
	return v, nil
}

// virtualIPs are the addresses the forwarder's TCP and UDP frontends in
// snap listen on: what local steering puts on the device. Loopback and
// unspecified addresses (a static file's) are the node's already; IPv6
// ones are left out unless the node serves IPv6.
func virtualIPs(snap *lb.Snapshot, ipv6 bool) map[netip.Addr]bool {
	want := map[netip.Addr]bool{}
	for _, b := range snap.Balancers() {
		if b.Service.Protocol != lb.TCP && b.Service.Protocol != lb.UDP {
			continue // SCTP is not served by the forwarder
		}
		for fe := range snap.Frontends(b) {
			a := fe.Addr.Addr().Unmap()
			if !a.IsLoopback() && !a.IsUnspecified() && (ipv6 || a.Is4()) {
				want[a] = true
			}
		}
	}
	return want
}

// add puts every address of want on the device, creating it when missing;
// before the forwarder binds them. full (or the first call) reads the
// device and the node's addresses first and puts back what someone else
// removed. An address of the node's own (an ExternalIP that is a node IP)
// is not added: the node has it already, and removing it from the device
// later could take routes with it. An address that cannot be added is
// logged and tried again on the next sync; the rest are added regardless.
// The error is for what stops every address: no device.
func (v *vips) add(ctx context.Context, want map[netip.Addr]bool, full bool) error {
	if v.on == nil || full {
		if err := v.read(ctx); err != nil {
			return err
		}
	}
	var missing []netip.Addr
	for a := range want {
		if !v.on[a] && !v.node[a] {
			missing = append(missing, a)
		}
	}
	slices.SortFunc(missing, netip.Addr.Compare)
	added := 0
	for _, a := range missing {
		if err := v.links.AddAddr(ctx, v.dev, a); err != nil {
			if errors.Is(err, iface.ErrNoLink) { // deleted by someone: the next sync reads and recreates it
				v.on = nil
				return fmt.Errorf("adding virtual IP %v: %w", a, err)
			}
			v.failed.Add(1)
			v.log.Warn("cannot add a virtual IP: its frontends are not served until it can be; retrying on each sync",
				zap.String("device", v.dev), zap.Stringer("address", a), zap.Error(err))
			continue
		}
		v.on[a] = true
		added++
	}
	if added > 0 {
		v.log.Debug("added virtual IPs", zap.String("device", v.dev), zap.Int("added", added), zap.Int("total", len(v.on)))
	}
	v.counted()
	return nil
}

// read learns what is on the device, creating it when missing, and the
// node's own addresses.
func (v *vips) read(ctx context.Context) error {
	node, err := v.links.NodeAddrs(ctx, v.dev)
	if err != nil {
		return fmt.Errorf("listing the node's addresses: %w", err)
	}
	v.node = map[netip.Addr]bool{}
	for _, a := range node {
		v.node[a] = true
	}
	have, err := v.links.Addrs(ctx, v.dev)
	if errors.Is(err, iface.ErrNoLink) {
		if err := v.links.EnsureDummy(ctx, v.dev); err != nil {
			return fmt.Errorf("creating dummy interface %s: %w", v.dev, err)
		}
		have, err = v.links.Addrs(ctx, v.dev)
	}
	if err != nil {
		return fmt.Errorf("listing addresses of %s: %w", v.dev, err)
	}
	if v.on != nil {
		for a := range v.on {
			if !slices.Contains(have, a) {
				v.log.Warn("virtual IP was removed from the device by someone else: adding it back", zap.String("device", v.dev), zap.Stringer("address", a))
			}
		}
	}
	v.on = map[netip.Addr]bool{}
	for _, a := range have {
		if !(a.Is6() && a.IsLinkLocalUnicast()) { // the kernel's own fe80::, were the link ever up
			v.on[a] = true
		}
	}
	v.counted()
	return nil
}

// prune removes the addresses want no longer has; after the forwarder
// closed their listeners. An address that cannot be removed is logged and
// tried again on the next sync.
func (v *vips) prune(ctx context.Context, want map[netip.Addr]bool) {
	if v.on == nil {
		return // add found the device gone; the next sync reads it again
	}
	var gone []netip.Addr
	for a := range v.on {
		if !want[a] {
			gone = append(gone, a)
		}
	}
	slices.SortFunc(gone, netip.Addr.Compare)
	for _, a := range gone {
		if err := v.links.DelAddr(ctx, v.dev, a); err != nil {
			v.failed.Add(1)
			v.log.Warn("cannot remove a virtual IP; retrying on each sync", zap.String("device", v.dev), zap.Stringer("address", a), zap.Error(err))
			continue
		}
		delete(v.on, a)
	}
	v.counted()
}

// release closes the rtnetlink socket newVIPs opened, if it did.
func (v *vips) release() {
	if v.close != nil {
		v.close()
		v.close = nil
	}
}

// remove deletes the device and every address on it.
func (v *vips) remove(ctx context.Context) error {
	if err := v.links.DeleteLink(ctx, v.dev); err != nil {
		return fmt.Errorf("deleting dummy interface %s: %w", v.dev, err)
	}
	v.on = nil
	v.counted()
	return nil
}
