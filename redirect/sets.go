package redirect

import (
	"net/netip"
	"strconv"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// The ipset types svcproxy uses.
const (
	typeIPPort = netfilter.SetIPPort
	typeNet    = netfilter.SetNet
	typePort   = netfilter.SetPort
)

// Every ipset and chain svcproxy installs starts with one of these.
const (
	setPrefix   = "svcproxy-"
	chainPrefix = "SVCPROXY-"
)

// setID names one of svcproxy's ipsets.
type setID uint8

const (
	setSvc4 setID = iota
	setReject4
	setNPAddrs4
	setSvc6
	setReject6
	setNPAddrs6
	setNPTCP
	setNPUDP
	setNPRejectTCP
	setNPRejectUDP
	setShort4
	setShort6
	setInside4
	setInside6
	setNPShortTCP
	setNPShortUDP
	numSets
)

// maxElem caps the hash:ip,port sets: room for 1M frontends.
const maxElem = 1 << 20

var setDefs = [numSets]netfilter.SetDef{
	setSvc4:        {Name: "svcproxy-svc-v4", Type: typeIPPort, Family: netfilter.IPv4, MaxElem: maxElem},
	setReject4:     {Name: "svcproxy-reject-v4", Type: typeIPPort, Family: netfilter.IPv4, MaxElem: maxElem},
	setNPAddrs4:    {Name: "svcproxy-np-addrs-v4", Type: typeNet, Family: netfilter.IPv4, MaxElem: 65536},
	setSvc6:        {Name: "svcproxy-svc-v6", Type: typeIPPort, Family: netfilter.IPv6, MaxElem: maxElem},
	setReject6:     {Name: "svcproxy-reject-v6", Type: typeIPPort, Family: netfilter.IPv6, MaxElem: maxElem},
	setNPAddrs6:    {Name: "svcproxy-np-addrs-v6", Type: typeNet, Family: netfilter.IPv6, MaxElem: 65536},
	setNPTCP:       {Name: "svcproxy-np-tcp", Type: typePort},
	setNPUDP:       {Name: "svcproxy-np-udp", Type: typePort},
	setNPRejectTCP: {Name: "svcproxy-np-reject-tcp", Type: typePort},
	setNPRejectUDP: {Name: "svcproxy-np-reject-udp", Type: typePort},
	setShort4:      {Name: "svcproxy-short-v4", Type: typeIPPort, Family: netfilter.IPv4, MaxElem: maxElem},
	setShort6:      {Name: "svcproxy-short-v6", Type: typeIPPort, Family: netfilter.IPv6, MaxElem: maxElem},
	setInside4:     {Name: "svcproxy-inside-v4", Type: typeNet, Family: netfilter.IPv4, MaxElem: 65536},
	setInside6:     {Name: "svcproxy-inside-v6", Type: typeNet, Family: netfilter.IPv6, MaxElem: 65536},
	setNPShortTCP:  {Name: "svcproxy-np-short-tcp", Type: typePort},
	setNPShortUDP:  {Name: "svcproxy-np-short-udp", Type: typePort},
}

// perFamily picks the netfilter.IPv4 or netfilter.IPv6 set of a pair.
func perFamily(f netfilter.Family, v4, v6 setID) setID {
	if f == netfilter.IPv6 {
		return v6
	}
	return v4
}

func svcSet(f netfilter.Family) setID    { return perFamily(f, setSvc4, setSvc6) }
func rejectSet(f netfilter.Family) setID { return perFamily(f, setReject4, setReject6) }

// shortSet holds f's short-circuit frontends (also in its reject set).
func shortSet(f netfilter.Family) setID { return perFamily(f, setShort4, setShort6) }

// insideSet holds f's cluster CIDRs (Config.ClusterCIDRs).
func insideSet(f netfilter.Family) setID { return perFamily(f, setInside4, setInside6) }

func npAddrsSet(f netfilter.Family) setID { return perFamily(f, setNPAddrs4, setNPAddrs6) }

// member is one element of one of svcproxy's sets. It holds no pointers,
// so a map of 10,000s of them costs the garbage collector nothing to scan.
type member struct {
	set   setID
	proto lb.Protocol // hash:ip,port
	bits  uint8       // hash:net
	port  uint16      // hash:ip,port and bitmap:port
	addr  [16]byte    // hash:ip,port and hash:net, in 16-byte form
}

func addrMember(set setID, a netip.Addr, proto lb.Protocol, port uint16) member {
	return member{set: set, proto: proto, port: port, addr: a.As16()}
}

func netMember(set setID, p netip.Prefix) member {
	return member{set: set, bits: uint8(p.Bits()), addr: p.Addr().As16()}
}

func (m member) ip() netip.Addr {
	a := netip.AddrFrom16(m.addr)
	if setDefs[m.set].Family == netfilter.IPv4 {
		return a.Unmap()
	}
	return a
}

// String renders m as ipset prints it.
func (m member) String() string {
	switch setDefs[m.set].Type {
	case typePort:
		return strconv.Itoa(int(m.port))
	case typeNet:
		a := m.ip()
		if int(m.bits) == a.BitLen() {
			return a.String()
		}
		return netip.PrefixFrom(a, int(m.bits)).String()
	}
	return m.ip().String() + "," + netfilter.ProtoName(m.proto) + ":" + strconv.Itoa(int(m.port))
}
