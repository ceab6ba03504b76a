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

// TestClearUDP: the real Conntrack deletes the UDP entries sent to the
// virtual server and answered by the real server, in its family, and no
// others.
func TestClearUDP(t *testing.T) {
	ap := netip.MustParseAddrPort
	flows := []conntrack.Flow{
		{Proto: lb.UDP, OrigSrc: ap("10.0.0.1:5000"), OrigDst: ap("10.96.0.53:53"), ReplySrc: ap("10.244.1.5:53")},
		{Proto: lb.UDP, OrigSrc: ap("10.0.0.1:5001"), OrigDst: ap("10.96.0.53:53"), ReplySrc: ap("10.244.1.6:53")},
		{Proto: lb.TCP, OrigSrc: ap("10.0.0.1:5002"), OrigDst: ap("10.96.0.53:53"), ReplySrc: ap("10.244.1.5:53")},
		{Proto: lb.UDP, OrigSrc: ap("10.0.0.1:5003"), OrigDst: ap("10.96.0.54:53"), ReplySrc: ap("10.244.1.5:53")},
	}
	six := conntrack.Flow{Proto: lb.UDP, OrigSrc: ap("[fd00::1]:5000"), OrigDst: ap("[fd00::53]:53"), ReplySrc: ap("[fd00:244::5]:53")}
	tbl := &conntracktest.Table{}
	tbl.Add(netfilter.IPv4, flows...)
	tbl.Add(netfilter.IPv6, six)
	c := tableConntrack{tbl}
	ctx := context.Background()
	if n, err := c.ClearUDP(ctx, netip.MustParseAddr("10.96.0.53"), 53, ap("10.244.1.5:53")); n != 1 || err != nil {
		t.Fatalf("ClearUDP = %d, %v; want 1, nil", n, err)
	}
	if got, want := tbl.Flows(netfilter.IPv4), flows[1:]; !slices.Equal(got, want) {
		t.Errorf("IPv4 entries left %v, want %v", got, want)
	}
	if n, err := c.ClearUDP(ctx, netip.MustParseAddr("fd00::53"), 53, ap("[fd00:244::5]:53")); n != 1 || err != nil {
		t.Fatalf("ClearUDP = %d, %v; want 1, nil", n, err)
	}
	if got := tbl.Flows(netfilter.IPv6); len(got) != 0 {
		t.Errorf("IPv6 entries left %v, want none", got)
	}
}
