// Package redirect owns the rules that steer ClusterIP, ExternalIP,
// LoadBalancer and NodePort traffic into svcproxy's userspace forwarder,
// written by one of two backends from the same walk of the snapshot. It
// never imports forwarder: it takes the ports to steer to as input (Ports).
//
// # Backends
//
// BackendNFTables writes one owned nftables table per family
// (svcproxy-steering; its layout is in package steertable) over netlink: a
// map from frontend (address . protocol . port) to forwarder port that
// `redirect to :` reads, a NodePort map, short-circuit maps read only for
// sources inside the cluster, no-endpoints sets that are rejected, and the
// UDP sockets' ports that are dropped when reached directly. The rules are fixed; every change is elements only. It needs no
// iptables, ipset or nft binary. BackendIPTables is iptables with ipsets
// (below). BackendAuto, the default, probes for nftables (a throwaway table
// written and deleted in each family) and falls back to iptables; the
// first Apply of either removes what the other left, so a node switching
// backends never steers twice. The behavioural tests (TestSteering,
// TestNodePortAddresses, FuzzApply, TestPrivilegedTraffic) run both.
//
// # REDIRECT or DNAT
//
// Both backends steer with REDIRECT (`redirect`), shown below, unless
// Config.NodeIPs gives the family a node address: then with a DNAT to it
// and the same port. REDIRECT from PREROUTING goes to the first address
// of the interface the packet arrived on and is dropped when there is
// none, as on Calico's and Cilium's unnumbered pod veths
// (TestPrivilegedUnnumbered builds one); a DNAT to a local address does
// not care where the packet came in. From the node itself (OUTPUT)
// REDIRECT goes to loopback and the DNAT to the node address; both are
// local, SO_ORIGINAL_DST reads the same, and conntrack undoes either.
//
// Measured with TestPrivilegedScale -v (2026-11-26, this 2-core VM), 10,000
// Services × (1 ClusterIP, 10 endpoints): nftables from scratch 47 ms, one
// Service added or removed 0.4 ms median, 4.8 ms p99 (at 1,000: 28 ms and
// 0.1 ms); the incremental Apply asks the snapshot which Service ports
// changed and rewrites their elements alone. A full Apply rewrites the
// rules, reads every element back (36 ms at 10,000), writes the difference
// and counts a repair when the kernel held other than what was last
// written.
//
// # Layout of the iptables backend
//
// The number of iptables rules is fixed; Services live in ipset members, so
// adding or removing a Service changes one or two set members and rewrites
// no rule. Per address family (netfilter.IPv4 shown; netfilter.IPv6 mirrors it with -v6 sets):
//
//	ipsets
//	  svcproxy-svc-v4         hash:ip,port  frontends (ClusterIP, ExternalIP, LB IP) whose pool has endpoints
//	  svcproxy-reject-v4      hash:ip,port  frontends whose pool is empty: rejected at once
//	  svcproxy-np-addrs-v4    hash:net      --nodeport-addresses (only when restricted)
//	  svcproxy-np-tcp/-udp    bitmap:port   NodePorts with endpoints (both families)
//	  svcproxy-np-reject-tcp/-udp bitmap:port NodePorts without endpoints
//	  svcproxy-short-v4       hash:ip,port  frontends served only to clients inside the cluster (also in reject-v4)
//	  svcproxy-np-short-tcp/-udp bitmap:port  the same NodePorts (also in np-reject-*)
//	  svcproxy-inside-v4      hash:net      the cluster CIDRs (Config.ClusterCIDRs)
//
//	nat PREROUTING, OUTPUT -> SVCPROXY-SERVICES
//	  -m mark --mark M/M                                  RETURN  (the forwarder's own dials)
//	  -p tcp  svc-v4 dst,dst                              REDIRECT --to-ports TCP
//	  -p udp  svc-v4 dst,dst                              SVCPROXY-UDP (one REDIRECT per UDP frontend)
//	  -p tcp  short-v4 dst,dst inside-v4 src              REDIRECT --to-ports TCP
//	  -p udp  short-v4 dst,dst inside-v4 src              SVCPROXY-UDP
//	  (the same two with addrtype --src-type LOCAL: the node itself)
//	  reject-v4 dst,dst                                   RETURN  (a dead VIP is never a NodePort)
//	  addrtype LOCAL [np-addrs-v4 dst]                    SVCPROXY-NODEPORTS (last, like KUBE-NODEPORTS)
//	    -p tcp np-tcp dst                                 REDIRECT --to-ports TCP
//	    -p udp np-udp dst                                 SVCPROXY-NP-UDP (one REDIRECT per UDP NodePort)
//	    -p tcp np-short-tcp dst inside-v4 src             REDIRECT --to-ports TCP (and --src-type LOCAL)
//	    -p udp np-short-udp dst inside-v4 src             SVCPROXY-NP-UDP (and --src-type LOCAL)
//
//	filter INPUT, FORWARD, OUTPUT -> SVCPROXY-REJECT
//	  -m mark --mark M/M                                  RETURN
//	  -m conntrack --ctstate DNAT                         RETURN  (steered by nat: never judged here)
//	  -p tcp reject-v4 dst,dst                            REJECT tcp-reset
//	  -p udp reject-v4 dst,dst                            REJECT icmp-port-unreachable
//	  -p tcp addrtype LOCAL [np-addrs] np-reject-tcp dst  REJECT tcp-reset
//	  -p udp addrtype LOCAL [np-addrs] np-reject-udp dst  REJECT icmp-port-unreachable
//	  -p udp --dport P addrtype LOCAL                     DROP    (one per UDP frontend socket port P)
//
// A frontend or NodePort of an externalTrafficPolicy Local Service with no
// endpoint on this node but some elsewhere is served, as by kube-proxy,
// to clients inside the cluster (pods in the cluster CIDRs, and the node)
// with the Service's endpoints on every node (its short circuit,
// lb.Pool.ShortCircuit; the forwarder tells the clients apart again). It
// is in the short and the reject sets: steered from inside, refused by
// the kernel for everyone else, who never reaches the forwarder.
//
// UDP frontends get one rule each (their forwarder socket has its own port),
// but whether a UDP frontend is steered or rejected is still decided by set
// membership, so endpoints coming and going never rewrite a rule.
//
// A UDP frontend's socket listens on every address of the node (a datagram
// REDIRECT'ed from another host arrives at the incoming interface's
// address), so the filter chain drops datagrams that reach its port at a
// node address without having been steered: a ClusterIP-only Service is
// not reachable at the node's addresses. Its port stays stable: the first
// Apply reads the ports a previous process's rules redirect to
// (SteeredUDP; the userspace mode binds its sockets there again after a
// crash), and when a frontend's port changes or the frontend goes, its UDP
// conntrack entries are deleted, which would otherwise keep sending its
// flows to the old port.
//
// SCTP frontends are not steered at all: the forwarder has no SCTP sockets
// to serve them with (Go has none), and rejecting them would claim a
// decision svcproxy cannot make. Their packets go on untouched, as if no
// proxy ran; the kernel modes serve SCTP.
//
// # Syncing (iptables backend)
//
// Apply translates the snapshot into a netfilter.Ruleset and syncs it with
// a netfilter.Reconciler. A full Apply reads the current rules
// (iptables-save) and sets, counts a repair when they differ from what it
// last wrote, then writes the sets whose members differ in one `ipset
// restore` (each filled as a temporary set and swapped in, so packets never
// see a half-filled set) and every svcproxy chain, the jumps into them and
// the removal of stray svcproxy chains in one `iptables-restore --noflush`
// per family. An incremental Apply writes only
// the set members that changed (one `ipset restore` of add/del lines) and
// touches iptables only when the rules' text changed (UDP frontends or the
// ports). Cleanup removes everything named SVCPROXY-* / svcproxy-*.
//
// The kernel boundary is package netfilter: netfilter.Exec runs the real
// tools (optionally in a network namespace), netfiltertest.Fake keeps tables and
// sets in memory and traces packets through them, so tests assert where a
// packet goes, not rule text.
package redirect
