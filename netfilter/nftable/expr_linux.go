package nftable

import (
	"encoding/binary"
	"net/netip"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/netfilter"
)

// Registers: a concatenation's fields sit in consecutive 32-bit registers
// from Reg32 (NFT_REG32_00), which Reg1 (NFT_REG_1) also names.
const (
	Reg1  = 1
	Reg32 = 8
)

const ipsDNAT = 0x20 // IPS_DST_NAT: DNAT, REDIRECT

// Native32 is v in host order, as meta, ct and fib registers hold it.
func Native32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

// AddrRegs is how many 32-bit registers an address of fam takes.
func AddrRegs(fam netfilter.Family) uint32 { return uint32(AddrLen(fam)) / 4 }

// addrOffset is the offset of the source or destination address in the
// network header.
func addrOffset(fam netfilter.Family, dst bool) uint32 {
	switch {
	case fam == netfilter.IPv6 && dst:
		return 24
	case fam == netfilter.IPv6:
		return 8
	case dst:
		return 16
	}
	return 12
}

// LoadAddr loads the packet's destination (or source) address into reg.
func LoadAddr(fam netfilter.Family, dst bool, reg uint32) expr.Any {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: addrOffset(fam, dst), Len: uint32(AddrLen(fam))}
}

// Frontend loads daddr . l4proto . dport from Reg1 on and returns the next
// free 32-bit register.
func Frontend(fam netfilter.Family) ([]expr.Any, uint32) {
	next := Reg32 + AddrRegs(fam)
	return []expr.Any{
		LoadAddr(fam, true, Reg1),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: next},
		&expr.Payload{DestRegister: next + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
	}, next + 2
}

// NodePort loads l4proto . dport from Reg1 on and returns the next free
// 32-bit register.
func NodePort() ([]expr.Any, uint32) {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: Reg1},
		&expr.Payload{DestRegister: Reg32 + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
	}, Reg32 + 2
}

// Lookup matches the key from Reg1 on against set.
func Lookup(set string) expr.Any { return &expr.Lookup{SourceRegister: Reg1, SetName: set} }

// MapTo looks the key from Reg1 on up in map set and leaves the value in
// Reg1 on; no element ends the rule.
func MapTo(set string) expr.Any {
	return &expr.Lookup{SourceRegister: Reg1, DestRegister: Reg1, IsDestRegSet: true, SetName: set}
}

// Verdict is a verdict (chain only for jumps and gotos).
func Verdict(kind expr.VerdictKind, chain string) expr.Any {
	return &expr.Verdict{Kind: kind, Chain: chain}
}

// InPrefix matches (in) or fails to match (!in) the address in Reg1
// against p.
func InPrefix(fam netfilter.Family, p netip.Prefix, in bool) []expr.Any {
	n := uint32(AddrLen(fam))
	mask := make([]byte, n)
	for i := range p.Bits() {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	op := expr.CmpOpEq
	if !in {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Bitwise{SourceRegister: Reg1, DestRegister: Reg1, Len: n, Mask: mask, Xor: make([]byte, n)},
		&expr.Cmp{Op: op, Register: Reg1, Data: p.Masked().Addr().AsSlice()},
	}
}

// LocalDest matches a destination that is one of the node's addresses
// (fib daddr type local), without loopback unless loopback is set, and
// (one match each) inside one of prefixes when there are any: the
// NodePort match.
func LocalDest(fam netfilter.Family, prefixes []netip.Prefix, loopback bool) [][]expr.Any {
	head := []expr.Any{
		&expr.Fib{Register: Reg1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: Reg1, Data: Native32(unix.RTN_LOCAL)},
	}
	if !loopback {
		lo := netip.MustParsePrefix("127.0.0.0/8")
		if fam == netfilter.IPv6 {
			lo = netip.MustParsePrefix("::1/128")
		}
		head = append(head, LoadAddr(fam, true, Reg1))
		head = append(head, InPrefix(fam, lo, false)...)
	}
	if len(prefixes) == 0 {
		return [][]expr.Any{head}
	}
	var out [][]expr.Any
	for _, p := range prefixes {
		r := append([]expr.Any{}, head...)
		r = append(r, LoadAddr(fam, true, Reg1))
		out = append(out, append(r, InPrefix(fam, p, true)...))
	}
	return out
}

// RejectTCP answers with a TCP reset.
func RejectTCP() expr.Any { return &expr.Reject{Type: unix.NFT_REJECT_TCP_RST} }

// RejectICMP answers with ICMP (ICMPv6) port unreachable.
func RejectICMP(fam netfilter.Family) expr.Any {
	if fam == netfilter.IPv6 {
		return &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 4} // ICMPV6 port unreachable
	}
	return &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 3} // ICMP port unreachable
}

// IsTCP matches TCP (eq) or anything else (!eq).
func IsTCP(eq bool) []expr.Any {
	return IsProto(unix.IPPROTO_TCP, eq)
}

// IsProto matches IP protocol proto (eq) or anything else (!eq).
func IsProto(proto byte, eq bool) []expr.Any {
	op := expr.CmpOpEq
	if !eq {
		op = expr.CmpOpNeq
	}
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: Reg1}, &expr.Cmp{Op: op, Register: Reg1, Data: []byte{proto}}}
}

// CtDNAT matches a connection conntrack DNATed (op Neq: ct status dnat) or
// not (op Eq). REDIRECT is a DNAT to conntrack.
func CtDNAT(op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATUS, Register: Reg1},
		&expr.Bitwise{SourceRegister: Reg1, DestRegister: Reg1, Len: 4, Mask: Native32(ipsDNAT), Xor: Native32(0)},
		&expr.Cmp{Op: op, Register: Reg1, Data: Native32(0)},
	}
}

// Marked matches a packet mark with every bit of mark set (all) or with
// none of them (!all).
func Marked(mark uint32, all bool) []expr.Any {
	want := uint32(0)
	if all {
		want = mark
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: Reg1},
		&expr.Bitwise{SourceRegister: Reg1, DestRegister: Reg1, Len: 4, Mask: Native32(mark), Xor: Native32(0)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: Reg1, Data: Native32(want)},
	}
}

// Cat concatenates rule parts.
func Cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// Vmap looks the key from Reg1 on up in verdict map set and takes the
// verdict found (goto its chain); no element ends the rule.
func Vmap(set string) expr.Any {
	return &expr.Lookup{SourceRegister: Reg1, DestRegister: unix.NFT_REG_VERDICT, IsDestRegSet: true, SetName: set}
}
