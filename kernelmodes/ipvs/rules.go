package ipvs

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

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

type chainKey struct{ table, chain string }

// ourChains are the chains a sync writes, in the order it declares them.
var ourChains = []chainKey{
	{"nat", chainServices}, {"nat", chainNodePorts}, {"nat", chainMarkMasq}, {"nat", chainPostrouting},
	{"filter", chainFilter},
}

// jump is a rule "-j to" at the top of a builtin chain.
type jump struct{ table, from, to string }

var ourJumps = []jump{
	{"nat", "PREROUTING", chainServices},
	{"nat", "OUTPUT", chainServices},
	{"nat", "POSTROUTING", chainPostrouting},
	{"filter", "INPUT", chainFilter},
	{"filter", "OUTPUT", chainFilter},
}

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
	typeIP       = "hash:ip"
	typeIPPort   = "hash:ip,port"
	typeIPPortIP = "hash:ip,port,ip"
	typePort     = "bitmap:port"
)

type setDef struct {
	name   string
	typ    string
	family Family
	shared bool // bitmap:port, used by both families' rules
}

var setDefs = [numSets]setDef{
	setVIPs4:         {"svcproxy-ipvs-vips-v4", typeIP, IPv4, false},
	setVS4:           {"svcproxy-ipvs-vs-v4", typeIPPort, IPv4, false},
	setMasq4:         {"svcproxy-ipvs-masq-v4", typeIPPort, IPv4, false},
	setReject4:       {"svcproxy-ipvs-reject-v4", typeIPPort, IPv4, false},
	setLoop4:         {"svcproxy-ipvs-loop-v4", typeIPPortIP, IPv4, false},
	setNodeIPs4:      {"svcproxy-ipvs-nodeips-v4", typeIP, IPv4, false},
	setNPMasqSCTP4:   {"svcproxy-ipvs-np-masq-sctp-v4", typeIPPort, IPv4, false},
	setNPRejectSCTP4: {"svcproxy-ipvs-np-rej-sctp-v4", typeIPPort, IPv4, false},
	setVIPs6:         {"svcproxy-ipvs-vips-v6", typeIP, IPv6, false},
	setVS6:           {"svcproxy-ipvs-vs-v6", typeIPPort, IPv6, false},
	setMasq6:         {"svcproxy-ipvs-masq-v6", typeIPPort, IPv6, false},
	setReject6:       {"svcproxy-ipvs-reject-v6", typeIPPort, IPv6, false},
	setLoop6:         {"svcproxy-ipvs-loop-v6", typeIPPortIP, IPv6, false},
	setNodeIPs6:      {"svcproxy-ipvs-nodeips-v6", typeIP, IPv6, false},
	setNPMasqSCTP6:   {"svcproxy-ipvs-np-masq-sctp-v6", typeIPPort, IPv6, false},
	setNPRejectSCTP6: {"svcproxy-ipvs-np-rej-sctp-v6", typeIPPort, IPv6, false},
	setNPMasqTCP:     {"svcproxy-ipvs-np-masq-tcp", typePort, IPv4, true},
	setNPMasqUDP:     {"svcproxy-ipvs-np-masq-udp", typePort, IPv4, true},
	setNPRejectTCP:   {"svcproxy-ipvs-np-rej-tcp", typePort, IPv4, true},
	setNPRejectUDP:   {"svcproxy-ipvs-np-rej-udp", typePort, IPv4, true},
}

// famSet returns the family's variant of a per-family set (given as its
// IPv4 id).
func famSet(id setID, f Family) setID {
	if f == IPv6 && id < setVIPs6 {
		return id + setVIPs6
	}
	return id
}

func inetName(f Family) string {
	if f == IPv6 {
		return "inet6"
	}
	return "inet"
}

// createLine is the ipset restore line creating set d under name.
func (d setDef) createLine(name string, members int) string {
	if d.typ == typePort {
		return fmt.Sprintf("create %s %s range 0-65535", name, d.typ)
	}
	return fmt.Sprintf("create %s %s family %s hashsize %d maxelem %d", name, d.typ, inetName(d.family), hashSize(members), maxElem(members))
}

func hashSize(n int) int {
	h := 1024
	for h < n && h < 1<<20 {
		h *= 2
	}
	return h
}

func maxElem(n int) int { return max(65536, 2*n) }

func tmpName(name string) string { return name + "-t" }

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
	switch setDefs[m.set].typ {
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

// wantedSets are the sets this configuration uses.
func (m *Mode) wantedSets() []setID {
	var ids []setID
	for id := range numSets {
		d := setDefs[id]
		if d.shared || d.family == IPv4 || m.cfg.IPv6 {
			ids = append(ids, id)
		}
	}
	return ids
}

// chainRules renders the rules of each of ourChains for one family.
func (m *Mode) chainRules(fam Family) map[chainKey][]string {
	set := func(id setID) string { return setDefs[famSet(id, fam)].name }
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
	return map[chainKey][]string{
		{"nat", chainServices}: {
			"-m set --match-set " + set(setMasq4) + " dst,dst -j " + chainMarkMasq,
			// A VIP frontend is never a NodePort.
			"-m set --match-set " + set(setVS4) + " dst,dst -j RETURN",
			"-m set --match-set " + set(setNodeIPs4) + " dst -j " + chainNodePorts,
		},
		{"nat", chainNodePorts}: {
			"-p tcp -m set --match-set " + setDefs[setNPMasqTCP].name + " dst -j " + chainMarkMasq,
			"-p udp -m set --match-set " + setDefs[setNPMasqUDP].name + " dst -j " + chainMarkMasq,
			"-p sctp -m set --match-set " + set(setNPMasqSCTP4) + " dst,dst -j " + chainMarkMasq,
		},
		{"nat", chainMarkMasq}: {
			"-j MARK --or-mark " + mark,
		},
		{"nat", chainPostrouting}: {
			// Hairpin: an endpoint reaching itself through its Service.
			"-m set --match-set " + set(setLoop4) + " dst,dst,src -j MASQUERADE" + random,
			"-m mark ! --mark " + mark + "/" + mark + " -j RETURN",
			"-j MARK --xor-mark " + mark,
			"-j MASQUERADE" + random,
		},
		{"filter", chainFilter}: {
			"-p tcp " + isNew + " -m set --match-set " + set(setReject4) + " dst,dst -j REJECT --reject-with tcp-reset",
			"-p udp " + isNew + " -m set --match-set " + set(setReject4) + " dst,dst -j REJECT --reject-with " + unreachable,
			"-p sctp " + isNew + " -m set --match-set " + set(setReject4) + " dst,dst -j REJECT --reject-with " + unreachable,
			"-p tcp " + isNew + " -m set --match-set " + set(setNodeIPs4) + " dst -m set --match-set " + setDefs[setNPRejectTCP].name + " dst -j REJECT --reject-with tcp-reset",
			"-p udp " + isNew + " -m set --match-set " + set(setNodeIPs4) + " dst -m set --match-set " + setDefs[setNPRejectUDP].name + " dst -j REJECT --reject-with " + unreachable,
			"-p sctp " + isNew + " -m set --match-set " + set(setNPRejectSCTP4) + " dst,dst -j REJECT --reject-with " + unreachable,
			// Ports of a VIP that no Service uses: refused, not handed to
			// whatever the node listens on there.
			"-p tcp " + isNew + " -m set --match-set " + set(setVIPs4) + " dst -m set ! --match-set " + set(setVS4) + " dst,dst -j REJECT --reject-with tcp-reset",
			"-p udp " + isNew + " -m set --match-set " + set(setVIPs4) + " dst -m set ! --match-set " + set(setVS4) + " dst,dst -j REJECT --reject-with " + unreachable,
			"-p sctp " + isNew + " -m set --match-set " + set(setVIPs4) + " dst -m set ! --match-set " + set(setVS4) + " dst,dst -j REJECT --reject-with " + unreachable,
		},
	}
}

// ruleScript renders the iptables-restore input that declares (and so
// flushes) each of ourChains and fills it. extra adds lines to a table after
// the declarations (deletions, jumps), tail after the rules (chain removals).
func ruleScript(rules map[chainKey][]string, extra, tail map[string][]string) []byte {
	var b strings.Builder
	for _, tbl := range []string{"nat", "filter"} {
		fmt.Fprintf(&b, "*%s\n", tbl)
		for _, k := range ourChains {
			if k.table == tbl {
				fmt.Fprintf(&b, ":%s - [0:0]\n", k.chain)
			}
		}
		for _, line := range extra[tbl] {
			b.WriteString(line + "\n")
		}
		for _, k := range ourChains {
			if k.table != tbl {
				continue
			}
			for _, r := range rules[k] {
				fmt.Fprintf(&b, "-A %s %s\n", k.chain, r)
			}
		}
		for _, line := range tail[tbl] {
			b.WriteString(line + "\n")
		}
		b.WriteString("COMMIT\n")
	}
	return []byte(b.String())
}

// savedRules is what iptables-save shows of svcproxy's IPVS chains in one
// family: the rules of each SVCPROXY-IPVS-* chain and every rule elsewhere
// that jumps into one.
type savedRules struct {
	chains map[chainKey][]string
	jumps  []savedJump
}

type savedJump struct {
	table, chain, spec, target string
	plain                      bool // just "-j target"
}

// parseSave reads iptables-save output of one table.
func parseSave(out []byte, into *savedRules) {
	if into.chains == nil {
		into.chains = map[chainKey][]string{}
	}
	tbl := ""
	for line := range strings.Lines(string(out)) {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "*"):
			tbl = line[1:]
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if strings.HasPrefix(name, chainPrefix) {
				k := chainKey{tbl, name}
				if _, ok := into.chains[k]; !ok {
					into.chains[k] = []string{}
				}
			}
		case strings.HasPrefix(line, "-A "):
			chain, spec, _ := strings.Cut(line[3:], " ")
			if strings.HasPrefix(chain, chainPrefix) {
				k := chainKey{tbl, chain}
				into.chains[k] = append(into.chains[k], spec)
				continue
			}
			target := jumpTarget(spec)
			if strings.HasPrefix(target, chainPrefix) {
				into.jumps = append(into.jumps, savedJump{table: tbl, chain: chain, spec: spec, target: target, plain: spec == "-j "+target})
			}
		}
	}
}

// jumpTarget returns the -j (or -g) target of a rule specification.
func jumpTarget(spec string) string {
	f := strings.Fields(spec)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "-j" || f[i] == "--jump" || f[i] == "-g" || f[i] == "--goto" {
			return f[i+1]
		}
	}
	return ""
}

// jumpPlan splits the jump rules found into our wanted jumps (kept, once
// each) and the rest (to delete).
func jumpPlan(found []savedJump) (keep map[jump]bool, del []savedJump) {
	keep = map[jump]bool{}
	for _, j := range found {
		k := jump{j.table, j.chain, j.target}
		if j.plain && isOurJump(k) && !keep[k] {
			keep[k] = true
			continue
		}
		del = append(del, j)
	}
	return keep, del
}

func isOurJump(j jump) bool {
	for _, o := range ourJumps {
		if o == j {
			return true
		}
	}
	return false
}

func isOurChain(k chainKey) bool {
	for _, o := range ourChains {
		if o == k {
			return true
		}
	}
	return false
}
