// Package model owns the in-memory model of netfilter that both
// netfilter and netfilter/netfiltertest run on: the parser and printer of
// the iptables rule subset svcproxy writes (the canonical form netfilter
// compares with), the nat and filter tables with iptables-restore and
// iptables-save semantics, the ipsets with ipset restore semantics, and
// the packet tracer that walks a Kernel's tables as the kernel would.
//
// It is internal: netfilter uses the parser and printer (Canonical,
// CanonicalMembers, ReadTable) in production; netfiltertest.Fake wraps a
// Kernel as an in-memory Executor for tests.
package model
