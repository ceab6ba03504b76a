package conntrack_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/conntrack/conntracktest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// nodePort is a Match's OrigDst for a NodePort: any address, this port.
func nodePort(port uint16) netip.AddrPort { return netip.AddrPortFrom(netip.Addr{}, port) }

// TestMatch: each field narrows what a Match picks; an unset destination
// address and port 0 stand for any; other protocols' entries
// are never picked.
func TestMatch(t *testing.T) {
	dnated := conntrack.Flow{Proto: lb.UDP, OrigSrc: ap("10.0.0.1:5000"), OrigDst: ap("10.96.0.53:53"), ReplySrc: ap("10.244.1.5:53")}
	for _, tc := range []struct {
		name string
		m    conntrack.Match
		f    conntrack.Flow
		want bool
	}{
		{"exact", conntrack.Match{Proto: lb.UDP, OrigDst: ap("10.96.0.53:53"), ReplySrc: ap("10.244.1.5:53")}, dnated, true},
		{"another endpoint", conntrack.Match{Proto: lb.UDP, OrigDst: ap("10.96.0.53:53"), ReplySrc: ap("10.244.1.6:53")}, dnated, false},
		{"endpoint's port differs", conntrack.Match{Proto: lb.UDP, OrigDst: ap("10.96.0.53:53"), ReplySrc: ap("10.244.1.5:54")}, dnated, false},
		{"another address", conntrack.Match{Proto: lb.UDP, OrigDst: ap("10.96.0.54:53")}, dnated, false},
		{"another port", conntrack.Match{Proto: lb.UDP, OrigDst: ap("10.96.0.53:54")}, dnated, false},
		{"TCP", conntrack.Match{Proto: lb.TCP, OrigDst: ap("10.96.0.53:53")}, dnated, false},
		{"any reply source", conntrack.Match{Proto: lb.UDP, OrigDst: ap("10.96.0.53:53")}, dnated, true},
		{"NodePort: any address", conntrack.Match{Proto: lb.UDP, OrigDst: nodePort(30053), ReplySrc: ap("10.244.1.5:53")},
			conntrack.Flow{Proto: lb.UDP, OrigDst: ap("192.0.2.7:30053"), ReplySrc: ap("10.244.1.5:53")}, true},
		{"NodePort: another port", conntrack.Match{Proto: lb.UDP, OrigDst: nodePort(30053)},
			conntrack.Flow{Proto: lb.UDP, OrigDst: ap("192.0.2.7:30054"), ReplySrc: ap("10.244.1.5:53")}, false},
		{"the unspecified address is only itself", conntrack.Match{Proto: lb.UDP, OrigDst: ap("0.0.0.0:30053")},
			conntrack.Flow{Proto: lb.UDP, OrigDst: ap("192.0.2.7:30053"), ReplySrc: ap("10.244.1.5:53")}, false},
		{"any port", conntrack.Match{Proto: lb.UDP, OrigDst: ap("10.96.0.53:0")}, dnated, true},
		{"another protocol's entry", conntrack.Match{Proto: lb.TCP}, conntrack.Flow{Other: true, OrigDst: ap("10.96.0.53:0")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.m.Matches(tc.f); got != tc.want {
				t.Errorf("%v picks %v: %v, want %v", tc.m, tc.f, got, tc.want)
			}
		})
	}
}

func TestMatchString(t *testing.T) {
	for _, tc := range []struct {
		m    conntrack.Match
		want string
	}{
		{conntrack.Match{Proto: lb.UDP, OrigDst: ap("10.96.0.53:53"), ReplySrc: ap("10.244.1.5:53")}, "udp dst 10.96.0.53 dport 53 reply-src 10.244.1.5:53"},
		{conntrack.Match{Proto: lb.UDP, OrigDst: nodePort(30053)}, "udp dport 30053"},
		{conntrack.Match{Proto: lb.UDP, OrigDst: ap("[::]:30053")}, "udp dst :: dport 30053"},
		{conntrack.Match{Proto: lb.SCTP}, "sctp"},
	} {
		if got := tc.m.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
}

// TestDeleteMatching: one read of the table deletes what any Match picks,
// and nothing else; no Match reads nothing; a failing table's error comes
// back.
func TestDeleteMatching(t *testing.T) {
	ctx := context.Background()
	flows := []conntrack.Flow{
		{Proto: lb.UDP, OrigSrc: ap("10.0.0.1:5000"), OrigDst: ap("10.96.0.53:53"), ReplySrc: ap("10.244.1.5:53")},
		{Proto: lb.UDP, OrigSrc: ap("10.0.0.1:5001"), OrigDst: ap("10.96.0.53:53"), ReplySrc: ap("10.244.1.6:53")},
		{Proto: lb.UDP, OrigSrc: ap("10.0.0.1:5002"), OrigDst: ap("192.0.2.7:30053"), ReplySrc: ap("10.244.1.5:53")},
		{Proto: lb.UDP, OrigSrc: ap("10.0.0.1:5003"), OrigDst: ap("10.96.0.99:8053"), ReplySrc: ap("127.0.0.1:40001")},
		{Proto: lb.TCP, OrigSrc: ap("10.0.0.1:5004"), OrigDst: ap("10.96.0.53:53"), ReplySrc: ap("10.244.1.5:53")},
	}
	var tbl conntracktest.Table
	tbl.Add(netfilter.IPv4, flows...)
	n, err := conntrack.DeleteMatching(ctx, &tbl, netfilter.IPv4, []conntrack.Match{
		{Proto: lb.UDP, OrigDst: ap("10.96.0.53:53"), ReplySrc: ap("10.244.1.5:53")},
		{Proto: lb.UDP, OrigDst: nodePort(30053), ReplySrc: ap("10.244.1.5:53")},
		{Proto: lb.UDP, OrigDst: ap("10.96.0.99:0")},
	})
	if err != nil || n != 3 {
		t.Errorf("DeleteMatching = %d, %v; want 3, nil", n, err)
	}
	if got, want := tbl.Flows(netfilter.IPv4), []conntrack.Flow{flows[1], flows[4]}; !slices.Equal(got, want) {
		t.Errorf("left %v, want %v", got, want)
	}
	if d := tbl.Deletes(); d != 1 {
		t.Errorf("%d reads of the table, want 1", d)
	}
	if n, err := conntrack.DeleteMatching(ctx, &tbl, netfilter.IPv4, nil); n != 0 || err != nil || tbl.Deletes() != 1 {
		t.Errorf("no Match: %d, %v, %d reads; want 0, nil and no read", n, err, tbl.Deletes()-1)
	}
	boom := errors.New("no ctnetlink")
	tbl.FailNext(boom)
	if _, err := conntrack.DeleteMatching(ctx, &tbl, netfilter.IPv4, []conntrack.Match{{Proto: lb.UDP}}); !errors.Is(err, boom) {
		t.Errorf("a failing table: %v, want %v", err, boom)
	}
}

// TestCounting: what the Table deleted is counted in its family, and a
// failed Delete counts only what it deleted.
func TestCounting(t *testing.T) {
	ctx := context.Background()
	var tbl conntracktest.Table
	tbl.Add(netfilter.IPv4, conntrack.Flow{Proto: lb.UDP, OrigDst: ap("10.96.0.53:53")}, conntrack.Flow{Proto: lb.UDP, OrigDst: ap("10.96.0.54:53")})
	tbl.Add(netfilter.IPv6, conntrack.Flow{Proto: lb.UDP, OrigDst: ap("[fd00::53]:53")})
	c := &conntrack.Counting{Table: &tbl}
	all := func(conntrack.Flow) bool { return true }
	if n, err := c.Delete(ctx, netfilter.IPv4, all); n != 2 || err != nil {
		t.Fatalf("Delete = %d, %v", n, err)
	}
	tbl.FailNext(errors.New("boom"))
	if _, err := c.Delete(ctx, netfilter.IPv6, all); err == nil {
		t.Fatal("the failure did not come back")
	}
	if got := [2]uint64{c.Deleted(netfilter.IPv4), c.Deleted(netfilter.IPv6)}; got != [2]uint64{2, 0} {
		t.Errorf("Deleted = %v, want [2 0]", got)
	}
	if n, _ := c.Delete(ctx, netfilter.IPv6, all); n != 1 || c.Deleted(netfilter.IPv6) != 1 {
		t.Errorf("IPv6: deleted %d, counted %d; want 1, 1", n, c.Deleted(netfilter.IPv6))
	}
}
