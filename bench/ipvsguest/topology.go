package main

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/internal/vmtest"
)

// The addresses of the topology (198.18.0.0/15, nothing else exists in the
// VM): the node is the VM's initial namespace, the client pod and the
// backends each a namespace of their own behind a veth, /32 addresses on
// both ends and the node as every other host's gateway (the CNI ptp shape).
var (
	nodeIP     = netip.MustParseAddr("198.18.0.1")
	podIP      = netip.MustParseAddr("198.18.1.1")
	backendIPs = []netip.Addr{
		netip.MustParseAddr("198.18.2.1"),
		netip.MustParseAddr("198.18.2.2"),
		netip.MustParseAddr("198.18.2.3"),
	}
	// serviceVIP is the data-path Service's ClusterIP and port; the
	// backends serve HTTP on backendPort.
	serviceVIP         = netip.MustParseAddrPort("198.19.0.10:80")
	backendPort uint16 = 8080
)

// host is one network namespace of the topology.
type host struct {
	name string
	ns   netns.NsHandle // netns.None() for the node (the initial namespace)
	ip   netip.Addr
	link string // the node's end of its veth
}

// topology is a client pod and the backends around the node. Each (round,
// mode) of the data path gets a fresh one, so no mode inherits another's
// TIME_WAIT sockets in the pod or the backends.
type topology struct {
	pod      host
	backends []host
	servers  []*server
}

// initNode makes the initial namespace the node: loopback up, forwarding on.
func initNode() error {
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); err != nil {
		return err
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	return h.LinkSetUp(lo)
}

// newTopology builds the pod and backend namespaces and starts the
// backends' HTTP servers.
func newTopology() (*topology, error) {
	t := &topology{}
	var err error
	if t.pod, err = addHost("pod", podIP); err != nil {
		t.close()
		return nil, err
	}
	for i, ip := range backendIPs {
		b, err := addHost("b"+strconv.Itoa(i), ip)
		if err != nil {
			t.close()
			return nil, err
		}
		t.backends = append(t.backends, b)
		s, err := startServer(b, backendPort)
		if err != nil {
			t.close()
			return nil, fmt.Errorf("starting %s's server: %w", b.name, err)
		}
		t.servers = append(t.servers, s)
	}
	return t, nil
}

// close stops the servers and removes the veths; the namespaces go with
// their last reference.
func (t *topology) close() {
	for _, s := range t.servers {
		s.close()
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err == nil {
		defer h.Close()
	}
	for _, x := range append([]host{t.pod}, t.backends...) {
		if x.link == "" {
			continue
		}
		if h != nil {
			if l, err := h.LinkByName(x.link); err == nil {
				_ = h.LinkDel(l) // deletes the peer too
			}
		}
		x.ns.Close()
	}
}

// addHost makes a namespace with a veth to the node.
func addHost(name string, ip netip.Addr) (host, error) {
	node, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return host{}, err
	}
	defer node.Close()
	ns, err := vmtest.NewNetNS()
	if err != nil {
		return host{}, err
	}
	h := host{name: name, ns: ns, ip: ip, link: "v-" + name}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: h.link}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}
	if err := node.LinkAdd(veth); err != nil {
		ns.Close()
		return host{}, fmt.Errorf("veth for %s: %w", name, err)
	}
	fail := func(err error) (host, error) {
		if l, lerr := node.LinkByName(h.link); lerr == nil {
			_ = node.LinkDel(l)
		}
		ns.Close()
		return host{}, fmt.Errorf("setting up %s: %w", name, err)
	}
	nl, err := node.LinkByName(h.link)
	if err != nil {
		return fail(err)
	}
	if err := node.AddrAdd(nl, &netlink.Addr{IPNet: &net.IPNet{IP: nodeIP.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		return fail(err)
	}
	if err := node.LinkSetUp(nl); err != nil {
		return fail(err)
	}
	if err := node.RouteAdd(vmtest.HostRoute(nl, ip)); err != nil {
		return fail(err)
	}
	in, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return fail(err)
	}
	defer in.Close()
	for _, n := range []string{"lo", "eth0"} {
		l, err := in.LinkByName(n)
		if err != nil {
			return fail(err)
		}
		if err := in.LinkSetUp(l); err != nil {
			return fail(err)
		}
	}
	eth0, err := in.LinkByName("eth0")
	if err != nil {
		return fail(err)
	}
	if err := in.AddrAdd(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		return fail(err)
	}
	if err := in.RouteAdd(vmtest.HostRoute(eth0, nodeIP)); err != nil {
		return fail(err)
	}
	if err := in.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: nodeIP.AsSlice()}); err != nil {
		return fail(fmt.Errorf("default route: %w", err))
	}
	return h, nil
}
