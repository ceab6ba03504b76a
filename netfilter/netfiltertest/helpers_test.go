package netfiltertest

import (
	"net/netip"
	"testing"

	"github.com/svcproxy/svcproxy/lb"
)

var (
	nodeIP     = netip.MustParseAddr("192.0.2.10")
	nodeIP6    = netip.MustParseAddr("2001:db8::10")
	localAddrs = []netip.Addr{nodeIP, nodeIP6}
	clientIP   = netip.MustParseAddrPort("10.244.1.5:40000")
	accepted   = Verdict{Action: Accept}
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// pkt is a packet from a pod (PREROUTING) unless hook says otherwise.
func pkt(proto lb.Protocol, dst string, hook Hook) Packet {
	src := clientIP
	d := ap(dst)
	if hook == Output {
		src = netip.AddrPortFrom(nodeIP, 40000)
	}
	if d.Addr().Is6() {
		src = ap("[fd00:244::5]:40000")
		if hook == Output {
			src = netip.AddrPortFrom(nodeIP6, 40000)
		}
	}
	return Packet{Src: src, Dst: d, Proto: proto, Hook: hook, LocalAddrs: localAddrs}
}

// checkTrace fails when f sends p anywhere but want (the Rule is ignored).
func checkTrace(t *testing.T, f *Fake, p Packet, want Verdict) {
	t.Helper()
	got := f.Trace(p)
	if got.Action != want.Action || got.Port != want.Port || got.Dst != want.Dst || got.Masquerade != want.Masquerade {
		t.Errorf("Trace(%v %v -> %v via %v) = %v (rule %q), want %v\n%s", p.Proto, p.Src, p.Dst, p.Hook, got, got.Rule, want, f.Dump())
	}
}

// sameVerdict reports whether v and o send a packet to the same place the
// same way (the deciding Rule aside).
func sameVerdict(v, o Verdict) bool {
	return v.Action == o.Action && v.Port == o.Port && v.Dst == o.Dst && v.Masquerade == o.Masquerade
}
