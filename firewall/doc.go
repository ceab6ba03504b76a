// Package firewall owns the enforcement of loadBalancerSourceRanges for
// every proxy mode: table svcproxy-firewall (one per family, ip and ip6),
// which drops traffic to a LoadBalancer IP and port from any source outside
// its Service's ranges, ahead of whatever then serves it (REDIRECT or local
// steering into the userspace forwarder, iptables or nftables DNAT, IPVS).
// Which sources a LoadBalancer IP takes is lb.Service.AllowedSources; this
// package only writes it down. It owns the narrow Kernel interface it
// writes through, its netlink implementation (over netfilter/nftable) and,
// in firewalltest, the in-memory fake with its packet tracer.
//
// The rules are fixed; the Services live in two sets (IPv4 shown):
//
//	chain filter-prerouting { type filter hook prerouting priority dstnat - 10; jump check }
//	chain filter-output     { type filter hook output priority dstnat - 10; jump check }
//	chain check {
//	  ip daddr . meta l4proto . th dport @firewalled
//	    ip daddr . meta l4proto . th dport . ip saddr != @allowed counter drop
//	}
//
// firewalled holds each LoadBalancer IP . protocol . port whose Service
// restricts its sources; allowed holds, for each, the source ranges it
// takes, as intervals of a concatenation (merged, since an interval set
// refuses overlaps). The priority puts the check before any DNAT or
// REDIRECT (dstnat, -100), as kube-proxy's firewall-check chain is; the
// output hook covers the node's own connections (a range holding a node
// address also admits the Service's LoadBalancer IPs as sources, for a
// VIP that is local on the node).
//
// Unlike kube-proxy, which checks only new connections (ct state new), the
// check applies to every packet: the firewall needs no connection tracking
// (local steering and the peers' footing run without it), and a range
// removed from a Service cuts the connections it admitted. A family with
// nothing to restrict has no table at all, so a node with no ranges pays
// nothing per packet; a node with some pays one hash lookup per packet
// that is not to a restricted frontend.
package firewall
