package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// Names of everything svcproxy's IPVS mode installs. Other modes use other
// names (SVCPROXY-*, svcproxy-*): this mode prunes and cleans up only its own.
const (
	chainPrefix = "SVCPROXY-IPVS-"
	setPrefix   = "svcproxy-ipvs-"

	chainServices    = "SVCPROXY-IPVS-SERVICES"
	chainNodePorts   = "SVCPROXY-IPVS-NODEPORTS"
	chainMarkMasq    = "SVCPROXY-IPVS-MARK-MASQ"
	chainPostrouting = "SVCPROXY-IPVS-POSTROUTING"
	chainFilter      = "SVCPROXY-IPVS-FILTER"
)

// ourJumps are the rules "-j To" at the top of builtin chains.
var ourJumps = slices.Concat(
	netfilter.Jumps("nat", chainServices, "PREROUTING", "OUTPUT"),
	netfilter.Jumps("nat", chainPostrouting, "POSTROUTING"),
	netfilter.Jumps("filter", chainFilter, "INPUT", "OUTPUT"),
)

// setID names one of the sets.
type setID uint8

// The sets. Per family: the VIPs, the VIP frontends, the ones whose traffic
// is masqueraded or rejected, the hairpin triples, the node IPs carrying
// NodePorts, and SCTP NodePorts masqueraded or rejected, as node IP and
// port (as kube-proxy: bitmap:port never matches an SCTP packet). Shared by
// both families: TCP and UDP NodePorts by protocol.
const (
	setVIPs4 setID = iota
	setVS4
	setMasq4
	setReject4
	setLoop4
	setNodeIPs4
	setNPMasqSCTP4
	setNPRejectSCTP4
	setVIPs6
	setVS6
	setMasq6
	setReject6
	setLoop6
	setNodeIPs6
	setNPMasqSCTP6
	setNPRejectSCTP6
	setNPMasqTCP
	setNPMasqUDP
	setNPRejectTCP
	setNPRejectUDP
	numSets
)

const (
	typeIP       = netfilter.SetIP
	typeIPPort   = netfilter.SetIPPort
	typeIPPortIP = netfilter.SetIPPortIP
	typePort     = netfilter.SetPort
)

var setDefs = [numSets]netfilter.SetDef{
	setVIPs4:         {Name: "svcproxy-ipvs-vips-v4", Type: typeIP, Family: IPv4},
	setVS4:           {Name: "svcproxy-ipvs-vs-v4", Type: typeIPPort, Family: IPv4},
	setMasq4:         {Name: "svcproxy-ipvs-masq-v4", Type: typeIPPort, Family: IPv4},
	setReject4:       {Name: "svcproxy-ipvs-reject-v4", Type: typeIPPort, Family: IPv4},
	setLoop4:         {Name: "svcproxy-ipvs-loop-v4", Type: typeIPPortIP, Family: IPv4},
	setNodeIPs4:      {Name: "svcproxy-ipvs-nodeips-v4", Type: typeIP, Family: IPv4},
	setNPMasqSCTP4:   {Name: "svcproxy-ipvs-np-masq-sctp-v4", Type: typeIPPort, Family: IPv4},
	setNPRejectSCTP4: {Name: "svcproxy-ipvs-np-rej-sctp-v4", Type: typeIPPort, Family: IPv4},
	setVIPs6:         {Name: "svcproxy-ipvs-vips-v6", Type: typeIP, Family: IPv6},
	setVS6:           {Name: "svcproxy-ipvs-vs-v6", Type: typeIPPort, Family: IPv6},
	setMasq6:         {Name: "svcproxy-ipvs-masq-v6", Type: typeIPPort, Family: IPv6},
	setReject6:       {Name: "svcproxy-ipvs-reject-v6", Type: typeIPPort, Family: IPv6},
	setLoop6:         {Name: "svcproxy-ipvs-loop-v6", Type: typeIPPortIP, Family: IPv6},
	setNodeIPs6:      {Name: "svcproxy-ipvs-nodeips-v6", Type: typeIP, Family: IPv6},
	setNPMasqSCTP6:   {Name: "svcproxy-ipvs-np-masq-sctp-v6", Type: typeIPPort, Family: IPv6},
	setNPRejectSCTP6: {Name: "svcproxy-ipvs-np-rej-sctp-v6", Type: typeIPPort, Family: IPv6},
	setNPMasqTCP:     {Name: "svcproxy-ipvs-np-masq-tcp", Type: typePort},
	setNPMasqUDP:     {Name: "svcproxy-ipvs-np-masq-udp", Type: typePort},
	setNPRejectTCP:   {Name: "svcproxy-ipvs-np-rej-tcp", Type: typePort},
	setNPRejectUDP:   {Name: "svcproxy-ipvs-np-rej-udp", Type: typePort},
}

// famSet returns the family's variant of a per-family set (given as its
// IPv4 id).
func famSet(id setID, f Family) setID {
	if f == IPv6 && id < setVIPs6 {
		return id + setVIPs6
	}
	return id
}

// member is one element of one set. It holds no pointers worth scanning
// beyond the netip.Addr zone handles, which are shared.
type member struct {
	set   setID
	ip    netip.Addr
	proto lb.Protocol
	port  uint16
	ip2   netip.Addr
}

// String renders m as `ipset save` prints it.
func (m member) String() string {
	switch setDefs[m.set].Type {
	case typePort:
		return strconv.Itoa(int(m.port))
	case typeIP:
		return m.ip.String()
	case typeIPPort:
		return m.ip.String() + "," + netfilter.ProtoName(m.proto) + ":" + strconv.Itoa(int(m.port))
	default:
		return m.ip.String() + "," + netfilter.ProtoName(m.proto) + ":" + strconv.Itoa(int(m.port)) + "," + m.ip2.String()
	}
}

// wantedSets are the sets this configuration uses, by setID (the others
// have no Name).
func (m *Mode) wantedSets() []netfilter.SetDef {
	defs := make([]netfilter.SetDef, numSets)
	for id, d := range setDefs {
		if d.Type == typePort || d.Family == IPv4 || m.cfg.IPv6 {
			defs[id] = d
		}
	}
	return defs
}

// ruleset is the rules and sets for want's members.
func (m *Mode) ruleset(want *desired) *netfilter.Ruleset {
	rs := netfilter.NewRuleset(m.families...)
	for _, fam := range m.families {
		rs.Chains[fam] = m.chainRules(fam)
		rs.Entries[fam] = ourJumps
	}
	m.sets.Fill(rs, m.wantedSets(), want.members, func(mem member) int { return int(mem.set) })
	return rs
}

// chainRules renders the rules of each of the chains for one family.
func (m *Mode) chainRules(fam Family) map[netfilter.ChainKey][]string {
	set := func(id setID) string { return setDefs[famSet(id, fam)].Name }
	mark := fmt.Sprintf("%#x", m.cfg.Mark)
	random := ""
	if m.randomFully != nil && *m.randomFully {
		random = " --random-fully"
	}
	unreachable := "icmp-port-unreachable"
	if fam == IPv6 {
		unreachable = "icmp6-port-unreachable"
	}
	isNew := "-m conntrack --ctstate NEW"
	return map[netfilter.ChainKey][]string{
		netfilter.Nat(chainServices): {
			"-m set --match-set " + set(setMasq4) + " dst,dst -j " + chainMarkMasq,
			// The node's own connections to a virtual server leave from
			// the VIP itself (every VIP is on the dummy interface), which
			// every node holds: an endpoint on another node would answer
			// its own node. Masqueraded, as kube-proxy's ipvs mode does
			// ("src,dst" over its cluster IP set).
			"-m set --match-set " + set(setVS4) + " src,dst -j " + chainMarkMasq,
			// A VIP frontend is never a NodePort.
			"-m set --match-set " + set(setVS4) + " dst,dst -j RETURN",
			"-m set --match-set " + set(setNodeIPs4) + " dst -j " + chainNodePorts,
		},
		netfilter.Nat(chainNodePorts): {
			"-p tcp -m set --match-set " + setDefs[setNPMasqTCP].Name + " dst -j " + chainMarkMasq,
			"-p udp -m set --match-set " + setDefs[setNPMasqUDP].Name + " dst -j " + chainMarkMasq,
			"-p sctp -m set --match-set " + set(setNPMasqSCTP4) + " dst,dst -j " + chainMarkMasq,
		},
		netfilter.Nat(chainMarkMasq): {
			"-j MARK --or-mark " + mark,
		},
		netfilter.Nat(chainPostrouting): {
			// Hairpin: an endpoint reaching itself through its Service.
			"-m set --match-set " + set(setLoop4) + " dst,dst,src -j MASQUERADE" + random,
			"-m mark ! --mark " + mark + "/" + mark + " -j RETURN",
			"-j MARK --xor-mark " + mark,
			"-j MASQUERADE" + random,
		},
		netfilter.Filter(chainFilter): {
			"-p tcp " + isNew + " -m set --match-set " + set(setReject4) + " dst,dst -j REJECT --reject-with tcp-reset",
			"-p udp " + isNew + " -m set --match-set " + set(setReject4) + " dst,dst -j REJECT --reject-with " + unreachable,
			"-p sctp " + isNew + " -m set --match-set " + set(setReject4) + " dst,dst -j REJECT --reject-with " + unreachable,
			"-p tcp " + isNew + " -m set --match-set " + set(setNodeIPs4) + " dst -m set --match-set " + setDefs[setNPRejectTCP].Name + " dst -j REJECT --reject-with tcp-reset",
			"-p udp " + isNew + " -m set --match-set " + set(setNodeIPs4) + " dst -m set --match-set " + setDefs[setNPRejectUDP].Name + " dst -j REJECT --reject-with " + unreachable,
			"-p sctp " + isNew + " -m set --match-set " + set(setNPRejectSCTP4) + " dst,dst -j REJECT --reject-with " + unreachable,
			// Ports of a VIP that no Service uses: refused, not handed to
			// whatever the node listens on there.
			"-p tcp " + isNew + " -m set --match-set " + set(setVIPs4) + " dst -m set ! --match-set " + set(setVS4) + " dst,dst -j REJECT --reject-with tcp-reset",
			"-p udp " + isNew + " -m set --match-set " + set(setVIPs4) + " dst -m set ! --match-set " + set(setVS4) + " dst,dst -j REJECT --reject-with " + unreachable,
			"-p sctp " + isNew + " -m set --match-set " + set(setVIPs4) + " dst -m set ! --match-set " + set(setVS4) + " dst,dst -j REJECT --reject-with " + unreachable,
		},
	}
}
