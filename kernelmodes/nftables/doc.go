// Package nftables owns svcproxy's nftables mode: the kernel forwards
// Service traffic itself through one owned table per address family (ip
// and ip6, both named svcproxy), translated from the same lb.Snapshot as
// every other mode. No policy is decided here: each Service port's Internal
// and External pools already say which endpoints serve ClusterIP traffic
// and which serve NodePort, ExternalIP and LoadBalancer traffic (ready
// first, then serving and terminating; traffic policies; topology).
//
// # Layout
//
// The rules are fixed: they depend on the configuration, never on the
// Services, which live only in sets and maps. A change is element-only, so
// the kernel never revalidates a chain graph that grows with the cluster
// (what makes kube-proxy's nftables mode take 14 s per change at 10,000
// Services, FACTS.md). IPv4 shown:
//
//	chain services {
//	  ip daddr . meta l4proto . th dport @masquerade-frontends meta mark set meta mark | 0x4000
//	  ip saddr != <cluster CIDR> ip daddr . meta l4proto . th dport @masquerade-off-cluster meta mark set meta mark | 0x4000
//	  ip daddr . meta l4proto . th dport @short-circuit jump short-circuit
//	  dnat ip to ip saddr . ip daddr . meta l4proto . th dport map @affinity   (when a Service has affinity)
//	  ip daddr . meta l4proto . th dport vmap @service-slots        (goto slots-N: N endpoints)
//	  fib daddr type local ip daddr != 127.0.0.0/8 [ip daddr <NodePort prefix>] jump nodeports
//	}
//	chain slots-N {   (N = 1..64)
//	  dnat ip to ip daddr . meta l4proto . th dport . numgen random mod N map @service-endpoints
//	}
//	chain short-circuit {   (pods and the node; the rest returns)
//	  fib saddr type local meta mark set meta mark | 0x4000
//	  fib saddr type != local ip saddr != <cluster CIDR> return
//	  dnat ip to ip saddr . ip daddr . meta l4proto . th dport map @affinity   (when a Service has affinity)
//	  ip saddr <cluster CIDR> ip daddr . meta l4proto . th dport vmap @short-circuit-slots   (goto short-circuit-slots-N)
//	  fib saddr type local ip daddr . meta l4proto . th dport vmap @short-circuit-slots
//	}
//	chain short-circuit-slots-N {
//	  dnat ip to ip daddr . meta l4proto . th dport . numgen random mod N offset 65536 map @service-endpoints
//	}
//	chain nodeports {
//	  meta l4proto . th dport @nodeport-masquerade meta mark set meta mark | 0x4000
//	  meta l4proto . th dport @nodeport-short-circuit jump nodeport-short-circuit   (as short-circuit)
//	  meta l4proto . th dport vmap @nodeport-slots                 (goto nodeport-slots-N)
//	}
//	chain nodeport-slots-N { dnat ip to meta l4proto . th dport . numgen random mod N map @nodeport-endpoints }
//	chain nodeport-short-circuit-slots-N { (the same, offset 65536) }
//	chain reject-no-endpoints {   (jumped to from filter input, output and forward)
//	  ct status dnat return
//	  ip daddr . meta l4proto . tcp dport @no-endpoints reject with tcp reset   (ICMP port unreachable for UDP and SCTP)
//	  <NodePort match> meta l4proto . tcp dport @nodeport-no-endpoints reject with tcp reset   (likewise)
//	}
//	chain nat-prerouting, nat-output { type nat hook ... priority dstnat; jump services }
//	chain nat-postrouting { type nat hook postrouting priority srcnat;
//	  (per affinity timeout T) ct status dnat ct original ip daddr . meta l4proto . ct original proto-dst @affinity-T
//	    update @affinity { ip saddr . ct original ip daddr . meta l4proto . ct original proto-dst timeout T : ip daddr . th dport }
//	  (and the same for NodePorts, from @affinity-nodeports-T)
//	  ct status dnat ip saddr . ip daddr @hairpin masquerade fully-random
//	  meta mark & 0x4000 == 0 return
//	  meta mark set meta mark & ~0x4000 masquerade fully-random
//	}
//
// Each frontend (ClusterIP, ExternalIP or LoadBalancer IP : port) and each
// NodePort with N endpoints of the family (at most Slots, 64) has N
// elements in the endpoints map, slot i holding endpoint i, and one in the
// slots verdict map sending it to the fixed chain that draws one of N slots
// with numgen: each endpoint gets exactly 1/N of the new connections. An
// endpoint change rewrites that frontend's elements that differ (the slots
// element too when N changes), adding a Service adds its elements,
// removing one deletes them: one transaction per family, whatever the
// cluster's size.
// The short circuit is kube-proxy's: under externalTrafficPolicy Local, a
// pod (a source in the cluster CIDR; without one no pod is told) or the
// node itself reaching an external frontend or NodePort gets the Cluster
// policy's endpoints (lb.Balancer.ShortCircuit), from slots numbered from
// ShortSlot in the same endpoints maps, the node's connections
// masqueraded; clients outside the cluster get this node's endpoints.
// Masquerade is where replies would otherwise bypass the node, as in the
// iptables mode: external traffic with the Cluster policy, ClusterIP traffic
// from outside the cluster CIDR (all ClusterIP traffic with MasqueradeAll,
// as kube-proxy's --masquerade-all; Local policies keep the client's
// address either way), and hairpin
// (an endpoint reaching itself) through one set of endpoint addresses. The
// sets' names are in Sets; their elements' encoding is nftable's
// FrontendKey, NodePortKey, SlotKey, EndpointValue and AddrPairKey, and a
// slots map's value is the chain's name (SlotsChain, NodePortSlotsChain).
//
// # Syncing
//
// The table is written over netlink (package netfilter/nftable, shared with
// redirect's nftables steering) with github.com/google/nftables, chosen
// by measurement against sigs.k8s.io/knftables (docs/design/nftables-library.md:
// at 10,000 Services knftables' nft exec parses for 10 s what netlink sends
// in about 1.4 s). One netlink socket serves the mode's life: closing a
// socket after a transaction that deleted elements cost 12–15 ms, most of
// an endpoint change. Kernel is the narrow boundary: Setup (table, sets,
// chains and rules, one transaction), Elements (read back), Update
// (deletions then additions, 64 elements a message, the whole change in
// one transaction up to about 50,000 elements; a larger one, such as a
// first load at 10,000 Services, in as few as fit, no element missing
// between its delete and re-add), Delete and Probe. nftablestest holds its in-memory Fake and
// a packet tracer over it.
//
// Measured with TestPrivilegedScale -v (2026-11-26, this 2-core VM): at
// 10,000 Services × 10 endpoints (150,000 elements), the first load takes
// 0.66 s, an endpoint change 0.64 ms p50 and 1 ms p99, adding a Service
// 2.1 ms p50 and 9.6 ms p99 (a change to a verdict map makes the kernel
// validate the map's every element at commit: about 1.5 ms at 10,000
// frontends), a periodic full Apply (the check) 5 ms. At 1,000 Services:
// 62 ms, and 0.5 ms p50 for either change. With 64 slot elements a
// frontend (the first layout, 680,000 elements) the first load took 1.9 s.
//
// The first Apply and one full Apply per Config.FullSyncPeriod (an hour)
// rewrite the fixed rules, read every element back, write the difference
// and count a repair when the kernel held something other than what the
// mode last wrote. Rewriting the rules makes the kernel validate the whole
// chain graph, every verdict map element included (0.8 s at 10,000
// Services), so other full Applies (the daemon asks every --sync-period)
// only check that the table, its sets and its chains with their number of
// rules are all there (5 ms), and go deep at once when they are not. An incremental
// Apply asks the snapshot which Service ports changed and writes their
// elements alone; an element shared by Service ports (hairpin) is counted,
// and goes with the last. A failed transaction falls back to a full sync.
// UDP flows DNATed to an endpoint that left its frontend lose their
// conntrack entries, so their next datagram picks a live endpoint.
// Cleanup deletes both tables, also when another process wrote them.
//
// # Differences from kube-proxy's nftables mode, and gaps
//
//   - Session affinity lives in one dynamic map (client . frontend →
//     endpoint, with the Service's timeout) that the kernel fills in nat
//     postrouting, read before the slot map; it is per frontend, where
//     kube-proxy's is per Service (a client reaching the ClusterIP and then
//     an ExternalIP may be sent to two endpoints). Each distinct timeout
//     has its own pair of sets and rules, so the first Service with a new
//     timeout (or the last with one) rewrites the rules in a full sync.
//     When an endpoint leaves, the clients remembered with it are deleted
//     from the map, so their next connection picks afresh.
//   - loadBalancerSourceRanges are not this table's: package firewall
//     enforces them for every mode, in a table of its own.
//   - A frontend with more than 64 endpoints spreads over 64 of them.
//   - A rule edited in place (same number of rules) is repaired by the
//     hourly deep sync, not by the periodic check.
//   - NodePorts are not served on loopback addresses (DNAT from 127.0.0.1
//     would need route_localnet), as in the iptables mode.
//   - DNAT cannot cross families: a frontend serves its own family's
//     endpoints, and one with none rejects.
package nftables
