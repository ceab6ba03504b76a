// Package steertable owns the nftables form of redirect's steering: the
// layout of table svcproxy-steering (one per family, ip and ip6), the
// narrow Kernel interface package redirect writes it through, and that
// interface's netlink implementation (over netfilter/nftable).
// steertabletest holds the in-memory fake and its packet tracer.
//
// The rules are fixed; the Services live in sets and maps, so adding a
// Service or its endpoints coming and going changes elements only. IPv4
// shown (mark M is the forwarder's own dials):
//
//	chain steer { type nat hook prerouting, and one hooked at output, priority dstnat
//	  meta mark & M == M return
//	  redirect to : ip daddr . meta l4proto . th dport map @frontends      (or dnat to To : …)
//	  fib saddr type local redirect to : ip daddr . meta l4proto . th dport map @short-circuit
//	  ip saddr <cluster CIDR> redirect to : ip daddr . meta l4proto . th dport map @short-circuit   (one per CIDR)
//	  ip daddr . meta l4proto . th dport @no-endpoints return    (a dead VIP is never a NodePort)
//	  fib daddr type local [ip daddr <NodePort prefix>] jump nodeports
//	}
//	chain nodeports {
//	  redirect to : meta l4proto . th dport map @nodeports
//	  fib saddr type local redirect to : meta l4proto . th dport map @nodeport-short-circuit
//	  ip saddr <cluster CIDR> redirect to : meta l4proto . th dport map @nodeport-short-circuit
//	}
//	chain reject { type filter hook input, forward and output, priority filter
//	  meta mark & M == M return
//	  ct status dnat return                                  (steered: never judged here)
//	  ip daddr . meta l4proto . th dport @no-endpoints reject   (TCP reset, else ICMP port unreachable)
//	  fib daddr type local [<NodePort prefix>] meta l4proto . th dport @nodeport-no-endpoints reject
//	  fib daddr type local udp dport @udp-sockets drop
//	}
//
// frontends maps each ClusterIP, ExternalIP and LoadBalancer IP . protocol
// . port with endpoints to the forwarder port that serves it: the one TCP
// redirect port (SO_ORIGINAL_DST finds the Service), or the UDP frontend's
// own socket. nodeports does the same for NodePorts (UDP ones have a
// socket per family). short-circuit and nodeport-short-circuit hold what an
// externalTrafficPolicy Local Service with endpoints on other nodes only
// serves to clients inside the cluster, as kube-proxy's short circuit
// does; the same frontends and NodePorts are in the no-endpoints sets,
// which reject everyone else. udp-sockets holds those UDP sockets' ports: they
// listen on every node address, and a datagram sent to one directly is
// dropped, so a ClusterIP-only Service is not reachable at the node.
// NodePorts are served on loopback too (neither redirect nor a DNAT to a
// node address needs route_localnet). With Layout.To set, both redirect
// statements are `dnat to To : …` instead.
package steertable

import (
	"context"
	"net/netip"

	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/nftable"
)

// Table is the name of the steering table in each family.
const Table = "svcproxy-steering"

// The sets and maps of each family's table; keys and values are encoded
// with nftable's FrontendKey, NodePortKey and PortValue.
const (
	// SetFrontends maps address . protocol . port → forwarder port.
	SetFrontends = "frontends"
	// SetNodePorts maps protocol . NodePort → forwarder port.
	SetNodePorts = "nodeports"
	// SetNoEndpoints holds address . protocol . port of frontends without
	// endpoints: rejected.
	SetNoEndpoints = "no-endpoints"
	// SetNodePortNoEndpoints holds protocol . NodePort of NodePorts without
	// endpoints: rejected on the NodePort addresses.
	SetNodePortNoEndpoints = "nodeport-no-endpoints"
	// SetUDPSockets holds the ports of the forwarder's UDP frontend
	// sockets: dropped when reached directly at a node address.
	SetUDPSockets = "udp-sockets"
	// SetShortCircuit maps address . protocol . port → forwarder port for
	// frontends served only through their short circuit (an
	// externalTrafficPolicy Local Service with endpoints on other nodes
	// only): steered for clients inside the cluster (Layout.ClusterCIDRs,
	// the node itself). They are in SetNoEndpoints too, which rejects
	// everyone else.
	SetShortCircuit = "short-circuit"
	// SetNodePortShortCircuit is SetShortCircuit for NodePorts (protocol .
	// NodePort → forwarder port), which are in SetNodePortNoEndpoints too.
	SetNodePortShortCircuit = "nodeport-short-circuit"
)

// Sets is every set and map of a table, in the order they are created.
var Sets = []string{SetFrontends, SetNodePorts, SetNoEndpoints, SetNodePortNoEndpoints, SetUDPSockets, SetShortCircuit, SetNodePortShortCircuit}

// IsMap reports whether set is a map (its elements have values).
func IsMap(set string) bool {
	return set == SetFrontends || set == SetNodePorts || set == SetShortCircuit || set == SetNodePortShortCircuit
}

// Layout is what a family's table looks like beyond its elements.
type Layout struct {
	Family netfilter.Family
	// Mark is the forwarder's mark: packets carrying all its bits are
	// never steered or rejected.
	Mark uint32
	// NodePorts says whether the family serves NodePorts at all;
	// NodePortPrefixes, if not empty, restricts them to local addresses
	// inside these prefixes.
	NodePorts        bool
	NodePortPrefixes []netip.Prefix
	// ClusterCIDRs are Family's pod prefixes: with the node's own
	// addresses (fib saddr type local), the sources a short-circuit
	// frontend or NodePort is steered for.
	ClusterCIDRs []netip.Prefix
	// To, when valid, is the node address of Family that steered packets
	// are DNATed to (with the forwarder port the map gives) instead of
	// redirected: redirect drops a packet whose incoming interface has no
	// address of the family, as pods' veths on Calico and Cilium have none.
	To netip.Addr
}

// Kernel is what redirect needs of nf_tables, one family's table at a time.
type Kernel interface {
	// Setup makes l's table, sets and chains exist and writes the chains'
	// rules, in one transaction, leaving elements alone. It reports whether
	// everything was already there as l says.
	Setup(ctx context.Context, l Layout) (intact bool, err error)
	// Elements reads a set's elements back: encoded key → encoded value
	// ("" in a set that is not a map).
	Elements(ctx context.Context, fam netfilter.Family, set string) (map[string]string, error)
	// Update deletes, then adds, elements of fam's table, in as few
	// transactions as fit.
	Update(ctx context.Context, fam netfilter.Family, del, add []nftable.Element) error
	// Delete removes fam's table; a table that is not there is no error.
	Delete(ctx context.Context, fam netfilter.Family) error
	// Probe reports why a throwaway copy of l's table (its rules: a DNAT
	// needs more of the kernel than a redirect) cannot be written, or nil.
	Probe(ctx context.Context, l Layout) error
}

// Netlink is the Kernel over nf_tables netlink in the named network
// namespace ns ("": this process's); on other systems every call fails.
func Netlink(ns string) Kernel { return newNetlink(ns) }
