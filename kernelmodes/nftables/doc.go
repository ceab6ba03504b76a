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
//	  dnat ip to ip saddr . ip daddr . meta l4proto . th dport map @affinity   (when a Service has affinity)
//	  dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 64 map @service-endpoints
//	  fib daddr type local ip daddr != 127.0.0.0/8 [ip daddr <NodePort prefix>] jump nodeports
//	}
//	chain nodeports {
//	  meta l4proto . th dport @nodeport-masquerade meta mark set meta mark | 0x4000
//	  dnat ip to meta l4proto . th dport . numgen random mod 64 map @nodeport-endpoints
//	}
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
// NodePort has Slots (64) map elements, filled round robin with its
// endpoints of the family; a new connection picks a slot with numgen. An
// endpoint change rewrites that frontend's 64 elements (deleting those
// whose value changes), adding a Service adds its elements, removing one
// deletes them: one transaction per family, whatever the cluster's size.
// Masquerade is where replies would otherwise bypass the node, as in the
// iptables mode: external traffic with the Cluster policy, ClusterIP traffic
// from outside the cluster CIDR, everything with MasqueradeAll, and hairpin
// (an endpoint reaching itself) through one set of endpoint addresses. The
// sets' names are in Sets; their elements' encoding is FrontendKey,
// NodePortKey, SlotKey, EndpointValue and HairpinKey.
//
// # Syncing
//
// The table is written over netlink with github.com/google/nftables, chosen
// by measurement against sigs.k8s.io/knftables (docs/design/nftables-library.md:
// at 10,000 Services knftables' nft exec parses for 10 s what netlink sends
// in about 1.4 s). One netlink socket serves the mode's life: closing a
// socket after a transaction that deleted elements cost 12–15 ms, most of
// an endpoint change. Kernel is the narrow boundary: Setup (table, sets,
// chains and rules, one transaction), Elements (read back), Update
// (deletions then additions, 64 elements a message and about 2,000 a
// transaction), Delete and Probe. nftablestest holds its in-memory Fake and
// a packet tracer over it.
//
// Measured with TestPrivilegedScale -v (2026-11-26, this 2-core VM): at
// 10,000 Services × 10 endpoints, the first load takes 1.9 s (0.45 s of it
// building the elements in Go), an endpoint change 0.7 ms p50 and 7 ms p99,
// adding a Service 0.65 ms p50 and 7.7 ms p99, a periodic full Apply (the
// check) 135–190 ms. At 1,000 Services: 0.19 s, 0.3 ms p50 and 1–4 ms p99
// for either change.
//
// The first Apply and one full Apply per Config.FullSyncPeriod (an hour)
// read every element back, write the difference and count a repair when
// the kernel held something other than what the mode last wrote. Other full
// Applies (the daemon asks every --sync-period) rewrite the fixed rules and
// check the table, sets and chains are all there (tens of milliseconds at
// 10,000 Services), and go deep at once when they are not. An incremental
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
//   - loadBalancerSourceRanges are not enforced (no mode of svcproxy reads
//     them yet: lb.Service has no such field).
//   - Traffic spreads over 64 slots: 3 endpoints get 22, 21 and 21 of them
//     (within 1/64 of even); a frontend with more than 64 endpoints uses 64.
//   - NodePorts are not served on loopback addresses (DNAT from 127.0.0.1
//     would need route_localnet), as in the iptables mode.
//   - DNAT cannot cross families: a frontend serves its own family's
//     endpoints, and one with none rejects.
//   - Steering for the userspace mode (--steering=redirect) still uses
//     iptables and ipset; an nftables form of it is not written yet.
package nftables
