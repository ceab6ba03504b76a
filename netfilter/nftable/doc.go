// Package nftable owns svcproxy's netlink boundary to nf_tables, shared by
// everything that writes an owned nftables table (the nftables mode in
// kernelmodes/nftables, the nftables form of redirect's steering): a
// declared table (its sets, chains and rules) written in one transaction
// over one lasting socket, element updates in one transaction up to about
// 50,000 elements (split in order beyond, see plan), reading a set back,
// deleting a table, a throwaway probe; the expressions the tables' rules
// are built from; and the byte encoding of set keys and values (which is
// portable, so fakes and tests use it on every system).
//
// It speaks netlink through github.com/google/nftables: no nft process, no
// parsing, no cache of the ruleset (docs/design/nftables-library.md has the
// measurement that chose it). Each consumer keeps its own narrow Kernel
// interface and in-memory fake; only their netlink implementations use
// this package, which is Linux-only beyond the encoding.
package nftable
