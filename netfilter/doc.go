// Package netfilter owns svcproxy's boundary to iptables and ipset: one
// declarative Ruleset and the Reconciler that makes the kernel hold it, the
// executor that runs iptables-restore/-save and ipset, and an in-memory Fake
// that parses the same input, refuses what the tools refuse, and traces
// packets through the tables.
//
// Every mode that programs netfilter (redirect's REDIRECT steering, the
// iptables DNAT mode, the IPVS mode's helper rules) is a translator: it turns
// a snapshot into a Ruleset (per family its owned chains with their rules in
// canonical form, the jumps into them from built-in chains, Parts that change
// on their own such as one Service's chains, rules and set members; and the
// ipsets) and hands it to its Reconciler's Sync. An incremental Sync writes
// only what differs from what it last wrote (one iptables-restore per family
// that changed, one ipset restore, no read); a full one reads what the mode
// owns, counts a repair when it was tampered with, swaps in differing sets,
// rewrites the chains and prunes what the mode owns but does not want. The
// Reconciler runs Tools: Exec runs the real tools (optionally in a network
// namespace, with the legacy or nft variant of iptables), Fake keeps the nat
// and filter tables of both families and the ipsets in memory.
//
// The Fake models the subset of the rule language svcproxy writes: -s, -d,
// -p with --dport; the mark, addrtype (--dst-type), conntrack (--ctstate),
// set (hash:ip,port, hash:ip,port,ip, hash:net, bitmap:port), recent and
// statistic (--mode random) matches; and the RETURN, ACCEPT, DROP, REJECT,
// REDIRECT, DNAT, MASQUERADE and MARK targets. Anything else is kept
// verbatim: it round-trips and can be deleted, but never matches a traced
// packet. It refuses what the real tools refuse for that subset (a jump to a
// missing chain, a rule naming a missing set, DNAT reachable from
// POSTROUTING, a port without -p, ...); TestPrivilegedFakeParity runs the
// same table against the real tools of both backends.
//
// Canonical renders a rule the way iptables-save prints it, so a mode that
// writes its rules in that form can compare what it reads back with what it
// wrote (TestPrivilegedCanonical checks this against both backends), and
// ReadOwned extracts a mode's own chains and the jumps into them from
// iptables-save output.
//
// # The tracer
//
// Fake.Trace answers "where does the first packet of a connection from A to
// VIP:port go?": nat PREROUTING or OUTPUT (REDIRECT, DNAT, MARK), then the
// filter chains the routing decision leads to (INPUT, FORWARD, OUTPUT), then
// nat POSTROUTING (MASQUERADE) for packets that leave through an interface.
// -m statistic draws from a seeded source and -m recent lists remember
// sources at the Fake's clock (Advance), so affinity can be tested with
// repeated traces. Fake.TraceAll follows every -m statistic branch instead
// and returns each outcome with its probability, without touching -m recent
// state: "traffic spreads evenly over exactly these endpoints" is one
// comparison.
package netfilter
