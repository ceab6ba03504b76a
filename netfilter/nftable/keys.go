package nftable

import (
	"encoding/binary"
	"net/netip"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// Element is one element of a set: Val is empty unless the set is a map;
// in a verdict map it is the name of the chain to goto. End is empty
// unless the set is a concatenation of ranges: then Key is each field's
// first value and End each field's last (inclusive).
type Element struct{ Set, Key, Val, End string }

// Keys and values are concatenations whose fields the kernel pads to 4
// bytes each; addresses and ports are in network order, a numgen slot in
// host order.

// ProtoNumber is p's IP protocol number.
func ProtoNumber(p lb.Protocol) byte {
	switch p {
	case lb.UDP:
		return 17
	case lb.SCTP:
		return 132
	}
	return 6
}

// ProtocolOf is the lb protocol of an IP protocol number (ok false for
// another protocol).
func ProtocolOf(n byte) (p lb.Protocol, ok bool) {
	switch n {
	case 6:
		return lb.TCP, true
	case 17:
		return lb.UDP, true
	case 132:
		return lb.SCTP, true
	}
	return 0, false
}

// AddrLen is the length of an address of fam.
func AddrLen(fam netfilter.Family) int {
	if fam == netfilter.IPv6 {
		return 16
	}
	return 4
}

// addrBytes is a in its family's length (4 or 16 bytes).
func addrBytes(a netip.Addr) []byte { return a.Unmap().AsSlice() }

// FrontendKey encodes address . protocol . port.
func FrontendKey(a netip.Addr, proto lb.Protocol, port uint16) string {
	b := addrBytes(a)
	b = append(b, ProtoNumber(proto), 0, 0, 0)
	b = binary.BigEndian.AppendUint16(b, port)
	return string(append(b, 0, 0))
}

// NodePortKey encodes protocol . port.
func NodePortKey(proto lb.Protocol, port uint16) string {
	b := []byte{ProtoNumber(proto), 0, 0, 0}
	b = binary.BigEndian.AppendUint16(b, port)
	return string(append(b, 0, 0))
}

// PortValue encodes a port (inet_service) alone, not in a concatenation:
// a map's value or a plain set's key (2 bytes, unpadded).
func PortValue(port uint16) string {
	return string(binary.BigEndian.AppendUint16(nil, port))
}

// DecodePort decodes a PortValue.
func DecodePort(v string) (uint16, bool) {
	if len(v) != 2 {
		return 0, false
	}
	return binary.BigEndian.Uint16([]byte(v[:2])), true
}

// DecodeFrontend decodes a FrontendKey of fam.
func DecodeFrontend(fam netfilter.Family, k string) (a netip.Addr, proto lb.Protocol, port uint16, ok bool) {
	n := AddrLen(fam)
	if len(k) != n+8 {
		return a, 0, 0, false
	}
	a, _ = netip.AddrFromSlice([]byte(k[:n]))
	proto, ok = ProtocolOf(k[n])
	return a, proto, binary.BigEndian.Uint16([]byte(k[n+4 : n+6])), ok
}

// DecodeNodePort decodes a NodePortKey.
func DecodeNodePort(k string) (proto lb.Protocol, port uint16, ok bool) {
	if len(k) != 8 {
		return 0, 0, false
	}
	proto, ok = ProtocolOf(k[0])
	return proto, binary.BigEndian.Uint16([]byte(k[4:6])), ok
}

// SlotKey appends slot (host order, as numgen writes it) to a frontend or
// NodePort key.
func SlotKey(key string, slot int) string {
	return string(binary.NativeEndian.AppendUint32([]byte(key), uint32(slot)))
}

// EndpointValue encodes an endpoint's address . port.
func EndpointValue(ep netip.AddrPort) string {
	b := addrBytes(ep.Addr())
	b = binary.BigEndian.AppendUint16(b, ep.Port())
	return string(append(b, 0, 0))
}

// DecodeEndpoint decodes an EndpointValue of fam.
func DecodeEndpoint(fam netfilter.Family, v string) (netip.AddrPort, bool) {
	n := AddrLen(fam)
	if len(v) != n+4 {
		return netip.AddrPort{}, false
	}
	a, _ := netip.AddrFromSlice([]byte(v[:n]))
	return netip.AddrPortFrom(a, binary.BigEndian.Uint16([]byte(v[n:n+2]))), true
}

// AffinityKey encodes client address . frontend address . protocol . port.
func AffinityKey(client, front netip.Addr, proto lb.Protocol, port uint16) string {
	return string(addrBytes(client)) + FrontendKey(front, proto, port)
}

// AddrPairKey encodes an address twice (the nftables mode's hairpin set).
func AddrPairKey(a netip.Addr) string {
	b := addrBytes(a)
	return string(append(b, addrBytes(a)...))
}
