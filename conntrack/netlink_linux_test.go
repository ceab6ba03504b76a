package conntrack

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/lb"
)

// TestFlowOf: what a predicate sees of an entry the netlink library
// parsed, and whether its destination was rewritten.
func TestFlowOf(t *testing.T) {
	tuple := func(proto uint8, src, dst string) netlink.IPTuple {
		s, d := netip.MustParseAddrPort(src), netip.MustParseAddrPort(dst)
		return netlink.IPTuple{Protocol: proto, SrcIP: net.IP(s.Addr().AsSlice()), DstIP: net.IP(d.Addr().AsSlice()), SrcPort: s.Port(), DstPort: d.Port()}
	}
	for _, tc := range []struct {
		name  string
		in    netlink.ConntrackFlow
		want  Flow
		nated bool
	}{
		{"TCP redirected",
			netlink.ConntrackFlow{Forward: tuple(unix.IPPROTO_TCP, "10.0.0.2:40000", "10.96.0.1:80"), Reverse: tuple(unix.IPPROTO_TCP, "10.0.0.1:15001", "10.0.0.2:40000"), ProtoInfo: &netlink.ProtoInfoTCP{State: 3}},
			Flow{Proto: lb.TCP, OrigSrc: ap("10.0.0.2:40000"), OrigDst: ap("10.96.0.1:80"), ReplySrc: ap("10.0.0.1:15001"), TCPState: 3}, true},
		{"TCP SYN unanswered",
			netlink.ConntrackFlow{Forward: tuple(unix.IPPROTO_TCP, "10.0.0.2:40000", "10.96.0.1:80"), Reverse: tuple(unix.IPPROTO_TCP, "10.96.0.1:80", "10.0.0.2:40000"), ProtoInfo: &netlink.ProtoInfoTCP{State: 1}},
			Flow{Proto: lb.TCP, OrigSrc: ap("10.0.0.2:40000"), OrigDst: ap("10.96.0.1:80"), ReplySrc: ap("10.96.0.1:80"), TCPState: SynSent}, false},
		{"UDP IPv6",
			netlink.ConntrackFlow{Forward: tuple(unix.IPPROTO_UDP, "[fd00::2]:5353", "[fd00:96::a]:53"), Reverse: tuple(unix.IPPROTO_UDP, "[fd00:96::a]:53", "[fd00::2]:5353")},
			Flow{Proto: lb.UDP, OrigSrc: ap("[fd00::2]:5353"), OrigDst: ap("[fd00:96::a]:53"), ReplySrc: ap("[fd00:96::a]:53")}, false},
		{"IPv4 in 16 bytes",
			netlink.ConntrackFlow{Forward: netlink.IPTuple{Protocol: unix.IPPROTO_UDP, SrcIP: net.ParseIP("10.0.0.2"), DstIP: net.ParseIP("10.96.0.10"), SrcPort: 5353, DstPort: 53},
				Reverse: netlink.IPTuple{Protocol: unix.IPPROTO_UDP, SrcIP: net.ParseIP("10.0.0.1").To4(), DstIP: net.ParseIP("10.0.0.2"), SrcPort: 40053, DstPort: 5353}},
			Flow{Proto: lb.UDP, OrigSrc: ap("10.0.0.2:5353"), OrigDst: ap("10.96.0.10:53"), ReplySrc: ap("10.0.0.1:40053")}, true},
		{"SCTP", netlink.ConntrackFlow{Forward: tuple(unix.IPPROTO_SCTP, "10.0.0.2:1", "10.96.0.1:2"), Reverse: tuple(unix.IPPROTO_SCTP, "10.96.0.1:2", "10.0.0.2:1")},
			Flow{Proto: lb.SCTP, OrigSrc: ap("10.0.0.2:1"), OrigDst: ap("10.96.0.1:2"), ReplySrc: ap("10.96.0.1:2")}, false},
		{"other protocol", netlink.ConntrackFlow{Forward: tuple(unix.IPPROTO_ICMP, "10.0.0.2:0", "10.96.0.1:0"), Reverse: tuple(unix.IPPROTO_ICMP, "10.96.0.1:0", "10.0.0.2:0")},
			Flow{Other: true, OrigSrc: ap("10.0.0.2:0"), OrigDst: ap("10.96.0.1:0"), ReplySrc: ap("10.96.0.1:0")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := flowOf(&tc.in)
			if got != tc.want {
				t.Errorf("flowOf = %+v, want %+v", got, tc.want)
			}
			if got.DstNATed() != tc.nated {
				t.Errorf("DstNATed = %v, want %v", got.DstNATed(), tc.nated)
			}
		})
	}
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
