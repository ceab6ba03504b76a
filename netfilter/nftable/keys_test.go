package nftable

import (
	"net/netip"
	"testing"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

func TestKeysRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		addr  string
		proto lb.Protocol
		port  uint16
	}{
		{"10.96.0.10", lb.TCP, 80},
		{"203.0.113.7", lb.UDP, 53},
		{"fd00::10", lb.SCTP, 65535},
		{"::ffff:10.0.0.1", lb.TCP, 1}, // a mapped address is its IPv4 form
	} {
		a := netip.MustParseAddr(tc.addr)
		fam := netfilter.FamilyOf(a.Unmap())
		k := FrontendKey(a, tc.proto, tc.port)
		if len(k) != AddrLen(fam)+8 {
			t.Errorf("FrontendKey(%v) is %d bytes, want %d", a, len(k), AddrLen(fam)+8)
		}
		ga, gp, gport, ok := DecodeFrontend(fam, k)
		if !ok || ga != a.Unmap() || gp != tc.proto || gport != tc.port {
			t.Errorf("DecodeFrontend(FrontendKey(%v %v %d)) = %v %v %d %v", a, tc.proto, tc.port, ga, gp, gport, ok)
		}
		np := NodePortKey(tc.proto, tc.port)
		if p, port, ok := DecodeNodePort(np); !ok || p != tc.proto || port != tc.port || len(np) != 8 {
			t.Errorf("DecodeNodePort(NodePortKey(%v %d)) = %v %d %v (len %d)", tc.proto, tc.port, p, port, ok, len(np))
		}
		ep := netip.AddrPortFrom(a.Unmap(), tc.port)
		if got, ok := DecodeEndpoint(fam, EndpointValue(ep)); !ok || got != ep {
			t.Errorf("DecodeEndpoint(EndpointValue(%v)) = %v %v", ep, got, ok)
		}
		if got, ok := DecodePort(PortValue(tc.port)); !ok || got != tc.port {
			t.Errorf("DecodePort(PortValue(%d)) = %d %v", tc.port, got, ok)
		}
	}
}

// FuzzDecode: whatever a decoder accepts, encoded again, decodes to the
// same values (padding bytes are not part of a key's meaning).
func FuzzDecode(f *testing.F) {
	f.Add([]byte{10, 0, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0})
	f.Add([]byte{17, 0, 0, 0, 0x75, 0x30, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
			if a, p, port, ok := DecodeFrontend(fam, string(b)); ok {
				if a2, p2, port2, ok := DecodeFrontend(fam, FrontendKey(a, p, port)); !ok || a2 != a || p2 != p || port2 != port {
					t.Errorf("DecodeFrontend(%x) = %v %v %d, which encodes to %v %v %d", b, a, p, port, a2, p2, port2)
				}
			}
			if ep, ok := DecodeEndpoint(fam, string(b)); ok {
				if ep2, ok := DecodeEndpoint(fam, EndpointValue(ep)); !ok || ep2 != ep {
					t.Errorf("DecodeEndpoint(%x) = %v, which encodes to %v", b, ep, ep2)
				}
			}
		}
		if p, port, ok := DecodeNodePort(string(b)); ok {
			if p2, port2, ok := DecodeNodePort(NodePortKey(p, port)); !ok || p2 != p || port2 != port {
				t.Errorf("DecodeNodePort(%x) = %v %d, which encodes to %v %d", b, p, port, p2, port2)
			}
		}
		if port, ok := DecodePort(string(b)); ok {
			if port2, ok := DecodePort(PortValue(port)); !ok || port2 != port {
				t.Errorf("DecodePort(%x) = %d, which encodes to %d", b, port, port2)
			}
		}
	})
}
