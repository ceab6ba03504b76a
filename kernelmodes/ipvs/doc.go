// Package ipvs owns svcproxy's IPVS mode: translating an lb.Snapshot into
// IPVS virtual and real servers, the dummy interface holding the virtual
// IPs, and the ipsets and fixed iptables rules IPVS mode needs (masquerade,
// NodePorts, refusing what no Service serves). It decides no policy: the
// pools of the snapshot are the real servers.
//
// # Layout
//
// Per Service port (lb.Balancer), one virtual server per frontend, with one
// real server (weight 1, masquerade forwarding) per usable backend of the
// pool that frontend uses:
//
//	ClusterIP:port                      Internal pool
//	ExternalIP:port, LoadBalancerIP:port External pool
//	NodeIP:NodePort, for each node IP    External pool
//
// The scheduler is Config.Scheduler (rr by default), or the one matching the
// algorithm the Service names (round-robin rr, least-conn lc, maglev mh).
// ClientIP affinity is persistence: flag persistent, timeout the affinity
// timeout in seconds, netmask /32 (/128). Every ClusterIP, ExternalIP and
// LoadBalancer IP is a /32 (/128) address of the dummy interface
// svcproxy-ipvs0, which is left down: the kernel still routes those
// addresses locally, so IPVS sees packets to them at LOCAL_IN (from pods)
// and LOCAL_OUT (from the node).
//
// The number of iptables rules is fixed; Services live in ipset members
// (IPv4 shown; IPv6 mirrors it with -v6 sets):
//
//	ipsets
//	  svcproxy-ipvs-vips-v4     hash:ip         every VIP on svcproxy-ipvs0
//	  svcproxy-ipvs-vs-v4       hash:ip,port    every VIP frontend (ip,proto:port)
//	  svcproxy-ipvs-masq-v4     hash:ip,port    VIP frontends whose traffic is masqueraded
//	  svcproxy-ipvs-reject-v4   hash:ip,port    VIP frontends without usable endpoints
//	  svcproxy-ipvs-loop-v4     hash:ip,port,ip endpoint,proto:port,endpoint (hairpin)
//	  svcproxy-ipvs-nodeips-v4  hash:ip         the node IPs NodePorts are served on
//	  svcproxy-ipvs-np-masq-tcp/-udp bitmap:port NodePorts masqueraded
//	  svcproxy-ipvs-np-rej-tcp/-udp  bitmap:port NodePorts without usable endpoints
//	  svcproxy-ipvs-np-masq-sctp-v4  hash:ip,port SCTP NodePorts masqueraded (nodeIP,sctp:port:
//	  svcproxy-ipvs-np-rej-sctp-v4   hash:ip,port bitmap:port never matches SCTP, as in kube-proxy)
//
//	nat PREROUTING, OUTPUT -> SVCPROXY-IPVS-SERVICES
//	  masq-v4 dst,dst                         SVCPROXY-IPVS-MARK-MASQ
//	  vs-v4 src,dst                           SVCPROXY-IPVS-MARK-MASQ (the node, from a VIP)
//	  vs-v4 dst,dst                           RETURN (a VIP frontend is never a NodePort)
//	  nodeips-v4 dst                          SVCPROXY-IPVS-NODEPORTS
//	    -p tcp np-masq-tcp dst                SVCPROXY-IPVS-MARK-MASQ (udp alike)
//	    -p sctp np-masq-sctp-v4 dst,dst       SVCPROXY-IPVS-MARK-MASQ
//	  SVCPROXY-IPVS-MARK-MASQ                 MARK --or-mark Mark
//	nat POSTROUTING -> SVCPROXY-IPVS-POSTROUTING
//	  loop-v4 dst,dst,src                     MASQUERADE (hairpin)
//	  ! mark Mark/Mark                        RETURN
//	                                          MARK --xor-mark Mark; MASQUERADE [--random-fully]
//	filter INPUT, OUTPUT -> SVCPROXY-IPVS-FILTER (new connections only)
//	  -p tcp reject-v4 dst,dst                REJECT tcp-reset (udp, sctp: icmp-port-unreachable)
//	  -p tcp nodeips-v4 dst np-rej-tcp dst    REJECT tcp-reset (udp alike; sctp: np-rej-sctp-v4 dst,dst)
//	  -p tcp vips-v4 dst ! vs-v4 dst,dst      REJECT tcp-reset (udp, sctp alike): a VIP's other
//	                                          ports never reach the node's own sockets
//
// Masquerading (mark, then MASQUERADE in POSTROUTING) applies to NodePort,
// ExternalIP and LoadBalancer traffic of Services with the Cluster external
// traffic policy, to ClusterIP traffic with Config.MasqueradeAll (as
// kube-proxy's, over its cluster IP set; Local policies keep the client's
// address either way), to an
// endpoint reaching itself through its Service, and to the node's own
// connections to a virtual server: their source is the VIP, which every
// node holds on its dummy interface, so an endpoint on another node would
// answer its own node (kube-proxy's ipvs mode masquerades them alike,
// "src,dst" over its cluster IP set). It needs
// net.ipv4.vs.conntrack=1, which a full sync sets, with
// expire_nodest_conn=1, expire_quiescent_template=1, ip_forward=1 and,
// on kernels 4.1 to 5.8, conn_reuse_mode=0 (Parameters; as kube-proxy
// does); svcproxy --init-only sets them where svcproxy itself may not
// write /proc/sys.
//
// # Ownership
//
// svcproxy owns every virtual server on an address of svcproxy-ipvs0 or on
// a node IP it serves NodePorts on, every address of svcproxy-ipvs0, every
// SVCPROXY-IPVS-* chain (and the jumps to them) and every svcproxy-ipvs-*
// set. A full sync prunes what it owns but the snapshot does not ask for;
// keep other IPVS users off those addresses.
//
// # Syncing
//
// Apply without full diffs the snapshot against what the last sync left
// (kept in memory): it adds set members, then VIPs, creates and updates
// virtual and real servers, drains removed real servers, removes VIPs and
// set members. When nothing changed it makes no kernel call. A removed TCP
// real server gets weight 0 and is deleted once its active and inactive
// connections are gone (checked on each Apply and by Sweep, which the
// mode's own sweeper calls periodically until Close), or after
// Config.DrainTimeout; a removed UDP real server is deleted at once and its
// conntrack entries cleared, so its flows are scheduled afresh; a removed SCTP one is deleted at once
// (kube-proxy's graceful termination is TCP's only). A full Apply reads
// IPVS, the dummy's addresses, the sets (ipset save) and the rules
// (iptables-save), counts a repair when they differ from what it last
// left, rewrites the sets (a set whose members differ is filled as a
// temporary set and swapped in) and the chains (one iptables-restore
// --noflush per family), and reconciles IPVS and the addresses against the
// kernel, not the memory. Cleanup removes all of it.
//
// # Kernel boundaries
//
// IPVS (the moby/ipvs Handle methods Mode calls), Links (rtnetlink), Rules
// (iptables-restore and ipset), Conntrack (ctnetlink) and Sysctls are
// interfaces; package ipvstest holds an in-memory fake of each
// (netfiltertest.Fake for Rules) and a packet tracer (ipvstest.Fakes.Trace:
// netfilter's tracer for the chains, then IPVS) that answers "a packet from A to VIP:port goes to which real
// server, masqueraded or not, or is it rejected or untouched", so tests
// assert behaviour, not calls. Available says whether the kernel has IPVS;
// the vmtest package runs the same Service table against a real kernel in a
// VM.
package ipvs
