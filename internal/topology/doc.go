// Package topology builds throwaway network-namespace topologies for
// svcproxy's tests, benchmarks and sandbox: a client ("pod") namespace, a node
// namespace that runs svcproxy, and backend namespaces, joined by veth pairs.
//
// The node is the router. Every other host has its own veth pair to the node,
// a point-to-point link with /32 addresses on both ends (the shape of the CNI
// "ptp" plugin), so traffic between two hosts always crosses the node's IP
// stack: its conntrack, its iptables/nftables hooks and its sockets see it,
// as they would on a Kubernetes node. (A bridge would let a backend answer a
// client at layer 2, around the node's reverse NAT.)
//
//	client0 eth0 198.18.1.1 ──── c0 ┐
//	client1 eth0 198.18.1.2 ──── c1 │  node 198.18.0.1 (lo and every link)
//	backend0 eth0 198.18.2.1 ─── b0 │  net.ipv4.ip_forward=1 in its namespace
//	backend1 eth0 198.18.2.2 ─── b1 ┘
//
// Clients and backends route 198.18.0.0/15 via the node and have no default
// route; the node routes only to its hosts. 198.19.0.0/16 ([FreeRange]) is
// used by no host: Service VIPs and ExternalIPs go there, reachable from
// every host through the node (see [Topology.AddNodeAddress]). Nothing is
// ever created in, or changed in, the namespace the caller runs in.
//
// Every host is dual-stack, with the same plan in unique local IPv6
// addresses: the node fd00:18::1 (on lo and every link, IPv6 forwarding on),
// client i fd00:18:1::(i+1), backend i fd00:18:2::(i+1), each routing
// fd00:18::/31 ([Range6]) via the node, and fd00:19::/32 ([FreeRange6]) free
// for Service VIPs. IPv6 has no peer addresses: the node routes each host's
// /128 to its link. Duplicate address detection is off in the topology's
// namespaces, so every address works at once.
//
// Namespaces are named Prefix + "<pid>-<6 hex digits>-<role>", e.g.
// "svcproxy-4242-a1b2c3-backend0", so parallel runs do not clash and
// [Cleanup] can tell a crashed run's leftovers from a live run's namespaces.
// [Topology.Close] deletes them; so does a SIGINT/SIGTERM handler that New
// installs (unless [Options.NoSignalCleanup]), which then lets the signal
// end the process as it would have.
//
// Everything needs root and the iproute2 `ip` command; New reports
// [ErrUnsupported] otherwise, and [NewT] skips the test.
package topology
