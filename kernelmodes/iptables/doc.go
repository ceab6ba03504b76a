// Package iptables owns svcproxy's iptables DNAT mode: the kernel forwards
// Service traffic itself, translated from the same lb.Snapshot the userspace
// mode serves. No policy is decided here: each Service port's Internal and
// External pools already say which endpoints serve ClusterIP traffic and
// which serve NodePort, ExternalIP and LoadBalancer traffic (ready first,
// then serving and terminating; traffic policies; topology); the mode writes
// them down as DNAT rules.
//
// # Layout
//
// Per address family (IPv4 shown), everything named SVCPROXY-DNAT-* or
// svcproxy-dnat-*:
//
//	nat PREROUTING, OUTPUT -> SVCPROXY-DNAT-SERVICES
//	  -d VIP/32 -p tcp -m tcp --dport P -j SVCPROXY-DNAT-S-<hash>   one per ClusterIP frontend
//	  -d EIP/32 -p tcp -m tcp --dport P -j SVCPROXY-DNAT-E-<hash>   one per ExternalIP / LB IP frontend
//	  -d VIP/32 ... -j RETURN                                       a frontend without endpoints (filter rejects it)
//	  ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL [-m set npaddrs dst] -j SVCPROXY-DNAT-NODEPORTS   last
//	SVCPROXY-DNAT-NODEPORTS: -p tcp -m tcp --dport NP -j SVCPROXY-DNAT-E-<hash>, one per NodePort
//	SVCPROXY-DNAT-S-<hash> (a Service port's internal pool)
//	  ! -s ClusterCIDR -j MARK --set-xmark 0x4000/0x4000   (with MasqueradeAll instead: -d VIP/32 -p tcp -m tcp --dport P -j MARK ..., per ClusterIP)
//	  -p tcp -m statistic --mode random --probability 1/n -j DNAT --to-destination EP1   (1/(n-1) for the next, ...)
//	  -p tcp -j DNAT --to-destination EPn
//	SVCPROXY-DNAT-E-<hash> (its external entry)
//	  -j MARK --set-xmark 0x4000/0x4000   (externalTrafficPolicy Cluster)
//	  (externalTrafficPolicy Local: the short circuit, to S, or C when S's endpoints differ)
//	  -s ClusterCIDR -j SVCPROXY-DNAT-S-<hash>
//	  -m addrtype --src-type LOCAL -j MARK --set-xmark 0x4000/0x4000
//	  -m addrtype --src-type LOCAL -j SVCPROXY-DNAT-S-<hash>
//	  -j SVCPROXY-DNAT-S-<hash>           (both pools the same), else the external pool's DNAT rules
//	  (an external frontend with no endpoint here but the short circuit's is
//	  "-d EIP/32 ... -g SVCPROXY-DNAT-E-<hash>" in SERVICES, and filter
//	  rejects what the entry leaves)
//	SVCPROXY-DNAT-C-<hash> (the short circuit's endpoints): DNAT rules
//	with session affinity, the pool's rules are kube-proxy's instead:
//	  -m recent --rcheck --seconds T --reap --name SVCPROXY-DNAT-A-<hash> ... -j SVCPROXY-DNAT-A-<hash>   per endpoint
//	  -p tcp -m statistic ... -j SVCPROXY-DNAT-A-<hash>
//	  SVCPROXY-DNAT-A-<hash>: -p tcp -m recent --set --name SVCPROXY-DNAT-A-<hash> ... -j DNAT --to-destination EP
//
//	nat POSTROUTING -> SVCPROXY-DNAT-POSTROUTING
//	  -m conntrack --ctstate DNAT -m set --match-set svcproxy-dnat-hairpin-v4 dst,dst,src -j MASQUERADE --random-fully
//	  -m mark ! --mark 0x4000/0x4000 -j RETURN
//	  -j MARK --set-xmark 0x4000/0x0
//	  -j MASQUERADE --random-fully
//
//	filter INPUT, OUTPUT -> SVCPROXY-DNAT-FILTER; FORWARD -> SVCPROXY-DNAT-FORWARD
//	  SVCPROXY-DNAT-FILTER: --ctstate DNAT RETURN; -j SVCPROXY-DNAT-REJECT; addrtype LOCAL ... -j SVCPROXY-DNAT-NP-REJECT
//	  SVCPROXY-DNAT-REJECT: -d VIP/32 -p tcp -m tcp --dport P -j REJECT --reject-with tcp-reset (per dead frontend)
//	  SVCPROXY-DNAT-FORWARD: -j SVCPROXY-DNAT-FILTER; marked ACCEPT; RELATED,ESTABLISHED ACCEPT
//
// Per-Service chains are named by kind (S, E, A) and 12 base32 characters
// of a SHA-256 of the Service port's name (and endpoint): 28 characters,
// iptables' limit. There are no per-endpoint chains except for affinity (one
// -m recent list per endpoint, as kube-proxy does) and no -m comment: at
// 10,000 Services × 10 endpoints the nat table holds about 110,000 rules,
// and what nf_tables costs per rule and per commit is what decides.
//
// The short circuit is kube-proxy's (its KUBE-EXT chains): under
// externalTrafficPolicy Local, a pod (a source within Config.ClusterCIDRs;
// without them no pod is told) or the node itself (--src-type LOCAL,
// masqueraded, as the external address may be its own) reaching an
// external frontend gets the Cluster policy's endpoints
// (lb.Balancer.ShortCircuit), as if it had gone out to the load balancer
// and come back in; only clients outside the cluster are held to this
// node's endpoints.
//
// Masquerade (mark, then MASQUERADE in POSTROUTING, --random-fully when
// iptables is at least 1.6.2 and the kernel takes it) is where replies would
// otherwise bypass the node: external traffic with the Cluster policy (its
// endpoint may be on another node), ClusterIP traffic from outside
// Config.ClusterCIDRs (all ClusterIP traffic with MasqueradeAll, as
// kube-proxy's --masquerade-all: "all traffic sent via Service cluster
// IPs"; it leaves external traffic alone), and hairpin — a
// pod reaching itself through its Service — matched by one fixed rule and
// the hash:ip,port,ip set of (endpoint, port, endpoint), as kube-proxy's
// IPVS mode does, instead of a rule per endpoint. Local traffic policies
// keep the client's address.
//
// # Syncing
//
// Each Apply translates the snapshot into a netfilter.Ruleset (the fixed
// chains, and a Part per Service port) that a netfilter.Reconciler syncs.
// A full sync reads both tables back (iptables-save) and the sets, counts a
// repair when they differ from what it last wrote, swaps in the sets whose
// members differ (filled as temporary sets), and rewrites every chain in one
// `iptables-restore --noflush` per family, deleting stray chains and jumps.
// At 10,000 Services that costs seconds (most of it nf_tables validating
// 110,000 rules), so, as kube-proxy does, a full Apply is a full sync only
// once per Config.FullSyncPeriod (an hour). In between, a full Apply (the
// daemon asks for one every --sync-period) checks what tampering usually
// hits — the fixed chains with the dispatch chain's rule per frontend
// (`iptables -S` of each), the jumps into them, the sets' existence — and
// does the full sync at once when any differs, else an incremental one.
// A Service's own chain or a set member changed behind svcproxy's back is
// repaired by the hourly full sync.
// An incremental Apply asks the snapshot which Service ports changed since
// the last Apply's (lb.Snapshot.Changed, which also reports a port whose
// frontends or NodePort changed hands in a conflict), declares and refills
// only the changed Services' chains, and deletes or inserts their single rules in the shared chains by
// specification (-D, -I SVCPROXY-DNAT-SERVICES 1, -A): the dispatch chain is
// never rewritten. Hairpin members change with one `ipset restore`. UDP
// flows DNATed to an endpoint that left its frontend lose their conntrack
// entries, so their next datagram picks a live endpoint. Cleanup removes
// everything named SVCPROXY-DNAT-* / svcproxy-dnat-*, also when another
// process installed it, and nothing of the other modes.
//
// # Differences from the userspace mode
//
//   - NodePorts are not served on loopback addresses (DNAT from 127.0.0.1
//     would need the route_localnet sysctl, which svcproxy never sets).
//   - The kernel has no retry on refusal, no passive health and no
//     algorithm choice: a connection goes to a uniformly random endpoint
//     (Pool.Algorithm is ignored), as in kube-proxy's iptables mode.
//   - DNAT cannot cross families: a frontend serves the endpoints of its own
//     family, and one whose pool has none of them rejects.
//   - Affinity is kube-proxy's: per endpoint -m recent lists (at most 100
//     clients each, xt_recent's default), shared by a Service's frontends.
//   - SCTP Services are served, as by kube-proxy's iptables mode: the same
//     rules with -p sctp -m sctp --dport (and sctp:port hairpin members);
//     a frontend without endpoints rejects with ICMP port unreachable. The
//     userspace mode cannot serve SCTP at all (no SCTP sockets in Go).
package iptables
