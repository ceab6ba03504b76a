// Package netfilter owns svcproxy's boundary to iptables and ipset: one
// declarative Ruleset and the Reconciler that makes the kernel hold it, the
// executor that runs iptables-restore/-save and ipset, and the canonical
// form of rules and set members a mode compares what it reads back with.
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
// namespace, with the legacy or nft variant of iptables); netfiltertest.Fake
// keeps the nat and filter tables of both families and the ipsets in memory.
//
// Canonical renders a rule the way iptables-save prints it, so a mode that
// writes its rules in that form can compare what it reads back with what it
// wrote (TestPrivilegedCanonical checks this against both backends), and
// ReadOwned extracts a mode's own chains and the jumps into them from
// iptables-save output.
//
// The parser, printer and in-memory tables behind Canonical and ReadOwned
// live in netfilter/internal/model; the in-memory Executor and packet
// tracer tests use, built on them, are netfilter/netfiltertest.
package netfilter
