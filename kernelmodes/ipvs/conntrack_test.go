package ipvs

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/conntrack/conntracktest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// TestFlushUDP: the UDP flows of the real servers a sync removed lose
// their entries in one read of the table per family, counted per family;
// nothing else goes, and a virtual server of no single address and port
// (another program's) has nothing cleared.
func TestFlushUDP(t *testing.T) {
	ap := netip.MustParseAddrPort
	flows := []conntrack.Flow{
		{Proto: lb.UDP, OrigSrc: ap("10.0.0.1:5000"), OrigDst: ap("10.96.0.53:53"), ReplySrc: ap("10.244.1.5:53")},
		{Proto: lb.UDP, OrigSrc: ap("10.0.0.1:5001"), OrigDst: ap("10.96.0.53:53"), ReplySrc: ap("10.244.1.6:53")},
		{Proto: lb.UDP, OrigSrc: ap("10.0.0.1:5002"), OrigDst: ap("10.96.0.53:53"), ReplySrc: ap("10.244.1.7:53")},
		{Proto: lb.TCP, OrigSrc: ap("10.0.0.1:5003"), OrigDst: ap("10.96.0.53:53"), ReplySrc: ap("10.244.1.5:53")},
		{Proto: lb.UDP, OrigSrc: ap("10.0.0.1:5004"), OrigDst: ap("10.96.0.54:99"), ReplySrc: ap("10.244.1.5:53")},
	}
	six := conntrack.Flow{Proto: lb.UDP, OrigSrc: ap("[fd00::1]:5000"), OrigDst: ap("[fd00::53]:53"), ReplySrc: ap("[fd00:244::5]:53")}
	tbl := &conntracktest.Table{}
	tbl.Add(netfilter.IPv4, flows...)
	tbl.Add(netfilter.IPv6, six)
	m := &Mode{ct: &conntrack.Counting{Table: tbl}}
	dns := vsKey{lb.UDP, ap("10.96.0.53:53")}
	m.forgetUDP(dns, ap("10.244.1.5:53"))
	m.forgetUDP(dns, ap("10.244.1.6:53"))
	m.forgetUDP(vsKey{lb.UDP, ap("10.96.0.54:0")}, ap("10.244.1.5:53"))     // a port-0 virtual server
	m.forgetUDP(vsKey{lb.UDP, ap("0.0.0.0:99")}, ap("10.244.1.5:53"))       // no single address
	m.forgetUDP(vsKey{lb.UDP, ap("[fd00::53]:53")}, ap("[fd00:244::5]:53")) // IPv6
	if err := m.flushUDP(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, want := tbl.Flows(netfilter.IPv4), flows[2:]; !slices.Equal(got, want) {
		t.Errorf("IPv4 entries left %v, want %v", got, want)
	}
	if got := tbl.Flows(netfilter.IPv6); len(got) != 0 {
		t.Errorf("IPv6 entries left %v, want none", got)
	}
	if tbl.Deletes() != 2 {
		t.Errorf("%d reads of the table, want one per family", tbl.Deletes())
	}
	if got := [2]uint64{m.ConntrackDeleted(netfilter.IPv4), m.ConntrackDeleted(netfilter.IPv6)}; got != [2]uint64{2, 1} {
		t.Errorf("ConntrackDeleted = %v, want [2 1]", got)
	}
	if err := m.flushUDP(context.Background()); err != nil || tbl.Deletes() != 2 {
		t.Errorf("a flush with nothing noted: %v, %d reads; want no read", err, tbl.Deletes()-2)
	}
}
