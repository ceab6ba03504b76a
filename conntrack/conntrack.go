// Package conntrack owns svcproxy's dealings with the kernel's connection
// tracking: deleting entries, and tuning the table. Deleting: a family's
// table read once over ctnetlink, and every entry a predicate picks deleted
// (Netlink). What an entry looks like to the predicate is Flow. Served and
// ClearUnNATed are what the NAT modes (REDIRECT steering, the iptables and
// nftables modes) do with it: delete the entries of packets that reached a
// frontend before it was served, which would keep their flows unserved.
// Match and DeleteMatching are the rest: a UDP flow whose endpoint left
// its frontend, or whose frontend moved to another forwarder port, loses
// its entry so that its next datagram is served anew. Tune sets the
// table's size and timeouts from kube-proxy's conntrack section, as
// kube-proxy does at start (tune.go). conntracktest holds the in-memory
// table and parameters.
package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// TCPState is a TCP entry's state as the kernel numbers them
// (enum tcp_conntrack).
type TCPState uint8

// SynSent is a connection whose SYN has had no answer: a SYN that no rule
// caught and that went nowhere stays so for nf_conntrack_tcp_timeout_syn_sent
// (two minutes), and the client's retransmissions, or a later connection
// from the same port, are taken for it.
const SynSent TCPState = 1

// Flow is what a predicate sees of an entry.
type Flow struct {
	Other    bool           // neither TCP, UDP nor SCTP: Proto means nothing
	Proto    lb.Protocol    // TCP, UDP or SCTP
	OrigSrc  netip.AddrPort // the client
	OrigDst  netip.AddrPort // where the client sent it
	ReplySrc netip.AddrPort // where replies come from: OrigDst unless NAT rewrote the destination
	TCPState TCPState       // TCP only
}

// DstNATed reports whether a rule rewrote f's destination (DNAT or
// REDIRECT). An entry that was not stays so: conntrack does not consult the
// nat rules again for the packets it takes to be f's.
func (f Flow) DstNATed() bool { return f.ReplySrc != f.OrigDst }

func (f Flow) String() string {
	proto := netfilter.ProtoName(f.Proto)
	if f.Other {
		proto = "other"
	}
	return fmt.Sprintf("%s %v → %v (replies from %v)", proto, f.OrigSrc, f.OrigDst, f.ReplySrc)
}

// Table deletes entries: Netlink, or conntracktest.Table.
type Table interface {
	// Delete deletes family's entries for which match is true and says how
	// many it deleted. An entry that vanished meanwhile is not an error.
	Delete(ctx context.Context, family netfilter.Family, match func(Flow) bool) (int, error)
}

// Counting is a Table that counts, per family, the entries its Table
// deleted: what a mode exports as kube-proxy's
// kubeproxy_conntrack_reconciler_deleted_entries_total. Safe for
// concurrent use if its Table is.
type Counting struct {
	Table
	deleted [2]atomic.Uint64
}

// Delete implements Table.
func (c *Counting) Delete(ctx context.Context, family netfilter.Family, match func(Flow) bool) (int, error) {
	n, err := c.Table.Delete(ctx, family, match)
	c.deleted[family].Add(uint64(n))
	return n, err
}

// Deleted counts the entries of family deleted so far; safe to call at any
// time.
func (c *Counting) Deleted(family netfilter.Family) uint64 { return c.deleted[family].Load() }
