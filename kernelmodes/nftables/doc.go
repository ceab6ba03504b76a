// Package nftables owns svcproxy's nftables mode: the kernel forwards
// Service traffic itself through one owned table per address family,
// translated from the same lb.Snapshot as every other mode.
package nftables
