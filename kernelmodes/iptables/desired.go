package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// Every chain this mode installs starts with chainPrefix, every set with
// setPrefix. Cleanup and the full sync's prune go by them, and touch nothing
// of the other modes (SVCPROXY-SERVICES, SVCPROXY-IPVS-*, ...).
const (
	chainPrefix = "SVCPROXY-DNAT-"
	setPrefix   = "svcproxy-dnat-"
)

// The fixed chains.
const (
	chainServices  = "SVCPROXY-DNAT-SERVICES"    // nat: one rule per frontend, then NodePorts
	chainNodePorts = "SVCPROXY-DNAT-NODEPORTS"   // nat: one rule per NodePort
	chainPost      = "SVCPROXY-DNAT-POSTROUTING" // nat: hairpin and marked masquerade
	chainFilter    = "SVCPROXY-DNAT-FILTER"      // filter: REJECT what has no endpoints
	chainForward   = "SVCPROXY-DNAT-FORWARD"     // filter: FILTER, then accept marked and established
	chainReject    = "SVCPROXY-DNAT-REJECT"      // filter: one REJECT per frontend without endpoints
	chainNPReject  = "SVCPROXY-DNAT-NP-REJECT"   // filter: one REJECT per NodePort without endpoints
)

// Per-Service chains are named kind + a hash, e.g. SVCPROXY-DNAT-S-ERIFXISQEP7F
// (28 characters, iptables' limit): S for a Service port's internal pool,
// E for its external entry, C for its short circuit's endpoints (when they
// are not S's), A for one endpoint of a Service with session affinity (also
// the name of its -m recent list).
const (
	kindService  = 'S'
	kindExternal = 'E'
	kindCluster  = 'C'
	kindAffinity = 'A'
)

// ourJumps are the rules "-j To" at the top of builtin chains.
var ourJumps = slices.Concat(
	netfilter.Jumps("nat", chainServices, "PREROUTING", "OUTPUT"),
	netfilter.Jumps("nat", chainPost, "POSTROUTING"),
	netfilter.Jumps("filter", chainFilter, "INPUT", "OUTPUT"),
	netfilter.Jumps("filter", chainForward, "FORWARD"),
)

// listChains are the fixed chains whose rules come from the Services, in
// any order (an incremental sync inserts and deletes single rules): the
// Services' rules make the head, the fixed ones (listTail) the end.
var listChains = []netfilter.ChainKey{
	netfilter.Nat(chainServices), netfilter.Nat(chainNodePorts), netfilter.Filter(chainReject), netfilter.Filter(chainNPReject),
}

// chainName is the name of a per-Service chain: kind, then 12 base32
// characters (60 bits) of a SHA-256 of the Service port's name and protocol
// and, for an affinity chain, the endpoint.
func chainName(kind byte, svc *lb.Service, ep netip.AddrPort) string {
	h := sha256.New()
	fmt.Fprintf(h, "%c/%s/%s/%s/%v", kind, svc.Name.Namespace, svc.Name.Name, svc.Name.Port, svc.Protocol)
	if ep.IsValid() {
		h.Write([]byte("/" + ep.String()))
	}
	sum := h.Sum(nil)
	return chainPrefix + string(kind) + "-" + base32.StdEncoding.EncodeToString(sum)[:12]
}

// svcRules is what one Service port needs in one family.
type svcRules struct {
	chains    []ownedChain // its own chains (S, E, C, A), each once
	services  []string     // its rules in SVCPROXY-DNAT-SERVICES
	nodePorts []string     // in SVCPROXY-DNAT-NODEPORTS
	reject    []string     // in SVCPROXY-DNAT-REJECT
	npReject  []string     // in SVCPROXY-DNAT-NP-REJECT
	hairpin   []string     // members of the family's hairpin set
	// udpFlows: UDP only, each frontend (a NodePort when its address is
	// unset) and an endpoint it may be DNATed to, as the conntrack entries
	// of such flows: when the pair goes, so must they.
	udpFlows []conntrack.Match
}

type ownedChain struct {
	name  string
	rules []string
}

// part is r as the Reconciler takes it.
func (r *svcRules) part(fam netfilter.Family) *netfilter.Part {
	p := &netfilter.Part{Chains: make(map[netfilter.ChainKey][]string, len(r.chains)), Rules: map[netfilter.ChainKey][]string{}}
	for _, c := range r.chains {
		p.Chains[netfilter.Nat(c.name)] = c.rules
	}
	for _, k := range listChains {
		if l := r.list(k); len(l) > 0 {
			p.Rules[k] = l
		}
	}
	if len(r.hairpin) > 0 {
		p.Members = map[string][]string{hairpinSet(fam): r.hairpin}
	}
	return p
}

// list returns r's rules for one of listChains.
func (r *svcRules) list(k netfilter.ChainKey) []string {
	switch k.Chain {
	case chainServices:
		return r.services
	case chainNodePorts:
		return r.nodePorts
	case chainReject:
		return r.reject
	case chainNPReject:
		return r.npReject
	}
	return nil
}

func familyOf(a netip.Addr) netfilter.Family { return netfilter.FamilyOf(a) }

func hostPrefix(a netip.Addr) string { return netip.PrefixFrom(a, a.BitLen()).String() }

func rejectWith(proto lb.Protocol, fam netfilter.Family) string {
	switch {
	case proto == lb.TCP:
		return "tcp-reset"
	case fam == netfilter.IPv6:
		return "icmp6-port-unreachable"
	}
	return "icmp-port-unreachable"
}

// probability renders 1/n as iptables-save prints it: the kernel keeps
// round(p * 2^31) and iptables prints that over 2^31 with 11 decimals.
func probability(n int) string {
	k := math.Round((1 << 31) / float64(n))
	return strconv.FormatFloat(k/(1<<31), 'f', 11, 64)
}

// maskAll is the -m recent --mask iptables-save prints for a family.
func maskAll(fam netfilter.Family) string {
	if fam == netfilter.IPv6 {
		return "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
	}
	return "255.255.255.255"
}

// natDest is a DNAT --to-destination as iptables-save prints it.
func natDest(a netip.AddrPort) string {
	if a.Addr().Is6() {
		return "[" + a.Addr().String() + "]:" + strconv.Itoa(int(a.Port()))
	}
	return a.String()
}

// compute translates one Service port into its rules for family fam. It
// decides nothing the snapshot has not: the pools say which endpoints serve
// internal and external traffic; compute only writes them down.
func (m *Mode) compute(snap *lb.Snapshot, bal *lb.Balancer, fam netfilter.Family) svcRules {
	svc := bal.Service
	var r svcRules
	proto := netfilter.ProtoName(svc.Protocol)
	port := strconv.Itoa(int(svc.Port))
	inFamily := func(p *lb.Pool) []netip.AddrPort {
		var out []netip.AddrPort
		if p == nil {
			return nil
		}
		for _, b := range p.Backends() {
			if a := netip.AddrPortFrom(b.Addr.Addr().Unmap(), b.Addr.Port()); familyOf(a.Addr()) == fam {
				out = append(out, a)
			}
		}
		return out
	}
	intEps, extEps := inFamily(bal.Internal), inFamily(bal.External)
	// The short circuit (externalTrafficPolicy Local): clients inside the
	// cluster, pods and the node, get the Cluster policy's endpoints at
	// the external frontends, as kube-proxy's KUBE-EXT chains give them.
	scEps := inFamily(bal.ShortCircuit)
	short := len(scEps) > 0
	sChain, eChain := chainName(kindService, svc, netip.AddrPort{}), chainName(kindExternal, svc, netip.AddrPort{})
	needS, needE := false, false
	var clusterIPs []string // the ClusterIP frontends' matches, for MasqueradeAll
	reject := rejectWith(svc.Protocol, fam)
	external := func(eps []netip.AddrPort) []netip.AddrPort { // who may be DNATed to at an external frontend
		if short {
			return append(slices.Clone(eps), scEps...)
		}
		return eps
	}

	// Only the frontends the snapshot gives this Service port: another
	// Service may have won some of them in a conflict.
	for fe, pool := range snap.Frontends(bal) {
		ip := fe.Addr.Addr()
		if !ip.IsValid() || pool == nil || familyOf(ip) != fam {
			continue
		}
		eps, chain, need := intEps, sChain, &needS
		if pool.External {
			eps, chain, need = extEps, eChain, &needE
		}
		match := "-d " + hostPrefix(ip) + " -p " + proto + " -m " + proto + " --dport " + port
		switch {
		case len(eps) > 0:
			r.services = append(r.services, match+" -j "+chain)
			if pool.External {
				eps = external(eps)
			} else {
				clusterIPs = append(clusterIPs, match)
			}
			r.addFlows(svc, fe.Addr, eps)
			*need = true
		case pool.External && short:
			// No endpoint here, but the short circuit's: the external
			// entry serves the clients inside and returns the rest to
			// PREROUTING or OUTPUT (goto: never on to the NodePorts),
			// and filter rejects them.
			r.services = append(r.services, match+" -g "+eChain)
			r.reject = append(r.reject, match+" -j REJECT --reject-with "+reject)
			r.addFlows(svc, fe.Addr, scEps)
			needE = true
		default:
			// RETURN, so a dead frontend on a node address never falls
			// through to the NodePorts; filter rejects it.
			r.services = append(r.services, match+" -j RETURN")
			r.reject = append(r.reject, match+" -j REJECT --reject-with "+reject)
		}
	}
	if np := snap.NodePort(bal); np != 0 && m.nodePorts[fam] {
		match := "-p " + proto + " -m " + proto + " --dport " + strconv.Itoa(int(np))
		if len(extEps) == 0 {
			r.npReject = append(r.npReject, match+" -j REJECT --reject-with "+reject)
		}
		if len(extEps) > 0 || short {
			r.nodePorts = append(r.nodePorts, match+" -j "+eChain)
			r.addFlows(svc, netip.AddrPortFrom(netip.Addr{}, np), external(extEps))
			needE = true
		}
	}
	r.services = sortedUnique(r.services)
	r.reject = sortedUnique(r.reject)

	affinity := map[string][]string{}
	if needS {
		var rules []string
		switch {
		case m.cfg.MasqueradeAll:
			// Traffic sent to the ClusterIPs, as kube-proxy's: not what
			// the external entry's short circuit or Cluster policy sends
			// on here.
			for _, match := range sortedUnique(clusterIPs) {
				rules = append(rules, match+" "+m.markRule)
			}
		case m.clusterCIDR[fam].IsValid():
			rules = append(rules, "! -s "+m.clusterCIDR[fam].String()+" "+m.markRule)
		}
		rules = append(rules, m.endpointRules(svc, intEps, fam, affinity)...)
		r.chains = append(r.chains, ownedChain{sChain, rules})
	}
	if needE {
		var rules []string
		if svc.ExternalTrafficPolicy == lb.PolicyCluster {
			// Replies from an endpoint on another node would bypass this
			// one: masquerade. Local policy keeps the client's address
			// (its endpoints are here, so replies come back this way),
			// MasqueradeAll or not, as kube-proxy's.
			rules = append(rules, m.markRule)
		}
		if short {
			// Pods and the node itself, as kube-proxy: to the Cluster
			// policy's endpoints (S's when they are the same), the node
			// masqueraded (the external address may be its own, and would
			// be the source the endpoint answers).
			to := sChain
			if !needS || !slices.Equal(intEps, scEps) {
				to = chainName(kindCluster, svc, netip.AddrPort{})
				r.chains = append(r.chains, ownedChain{to, m.endpointRules(svc, scEps, fam, affinity)})
			}
			if cidr := m.clusterCIDR[fam]; cidr.IsValid() {
				rules = append(rules, "-s "+cidr.String()+" -j "+to)
			}
			rules = append(rules, "-m addrtype --src-type LOCAL "+m.markRule, "-m addrtype --src-type LOCAL -j "+to)
		}
		switch {
		case len(extEps) == 0: // only the short circuit's
		case needS && svc.ExternalTrafficPolicy == lb.PolicyCluster && slices.Equal(intEps, extEps):
			rules = append(rules, "-j "+sChain)
		default:
			rules = append(rules, m.endpointRules(svc, extEps, fam, affinity)...)
		}
		r.chains = append(r.chains, ownedChain{eChain, rules})
	}
	for _, name := range sortedKeys(affinity) {
		r.chains = append(r.chains, ownedChain{name, affinity[name]})
	}
	if needS || needE {
		var used []netip.AddrPort
		if needS {
			used = intEps
		}
		if needE {
			used = append(slices.Clone(used), external(extEps)...)
		}
		seen := map[netip.AddrPort]bool{}
		for _, ep := range used {
			if !seen[ep] {
				seen[ep] = true
				r.hairpin = append(r.hairpin, ep.Addr().String()+","+proto+":"+strconv.Itoa(int(ep.Port()))+","+ep.Addr().String())
			}
		}
		slices.Sort(r.hairpin)
	}
	return r
}

func (r *svcRules) addFlows(svc *lb.Service, front netip.AddrPort, eps []netip.AddrPort) {
	if svc.Protocol != lb.UDP {
		return
	}
	for _, ep := range eps {
		if !slices.Contains(r.udpFlows, conntrack.Match{Proto: lb.UDP, OrigDst: front, ReplySrc: ep}) {
			r.udpFlows = append(r.udpFlows, conntrack.Match{Proto: lb.UDP, OrigDst: front, ReplySrc: ep})
		}
	}
}

// endpointRules spreads a connection evenly over eps with -m statistic
// (rule i of n matches with probability 1/(n-i), the last always), DNATing
// straight to the endpoint, or, for a Service with session affinity,
// first sends a client seen within the timeout back to its endpoint's chain
// (-m recent --rcheck), whose DNAT rule records the client (--set).
// Affinity chains are added to affinity.
func (m *Mode) endpointRules(svc *lb.Service, eps []netip.AddrPort, fam netfilter.Family, affinity map[string][]string) []string {
	proto := netfilter.ProtoName(svc.Protocol)
	n := len(eps)
	rules := make([]string, 0, 2*n)
	if svc.AffinityTimeout <= 0 {
		for i, ep := range eps {
			if i < n-1 {
				rules = append(rules, "-p "+proto+" -m statistic --mode random --probability "+probability(n-i)+" -j DNAT --to-destination "+natDest(ep))
			} else {
				rules = append(rules, "-p "+proto+" -j DNAT --to-destination "+natDest(ep))
			}
		}
		return rules
	}
	secs := strconv.FormatInt(int64((svc.AffinityTimeout+time.Second-1)/time.Second), 10)
	names := make([]string, n)
	for i, ep := range eps {
		names[i] = chainName(kindAffinity, svc, ep)
		rules = append(rules, "-m recent --rcheck --seconds "+secs+" --reap --name "+names[i]+" --mask "+maskAll(fam)+" --rsource -j "+names[i])
		affinity[names[i]] = []string{"-p " + proto + " -m recent --set --name " + names[i] + " --mask " + maskAll(fam) + " --rsource -j DNAT --to-destination " + natDest(ep)}
	}
	for i := range eps {
		if i < n-1 {
			rules = append(rules, "-p "+proto+" -m statistic --mode random --probability "+probability(n-i)+" -j "+names[i])
		} else {
			rules = append(rules, "-j "+names[i])
		}
	}
	return rules
}

func sortedUnique(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// fixedRules are the rules of the fixed chains for one family; listChains
// hold only their tail here (the Services' rules come first).
func (m *Mode) fixedRules(fam netfilter.Family) map[netfilter.ChainKey][]string {
	loopback := "127.0.0.0/8"
	if fam == netfilter.IPv6 {
		loopback = "::1/128"
	}
	// NodePorts: on the node's own addresses (within NodePortAddresses),
	// never on loopback (DNAT from 127.0.0.1 would need route_localnet).
	np := "! -d " + loopback + " -m addrtype --dst-type LOCAL"
	if m.npRestricted[fam] {
		np += " -m set --match-set " + npAddrsSet(fam) + " dst"
	}
	masq := "-j MASQUERADE"
	if m.randomFully {
		masq += " --random-fully"
	}
	mark := fmt.Sprintf("%#x/%#x", m.cfg.Mark, m.cfg.Mark)
	rules := map[netfilter.ChainKey][]string{
		netfilter.Nat(chainServices):  nil,
		netfilter.Nat(chainNodePorts): nil,
		netfilter.Nat(chainPost): {
			"-m conntrack --ctstate DNAT -m set --match-set " + hairpinSet(fam) + " dst,dst,src " + masq,
			"-m mark ! --mark " + mark + " -j RETURN",
			fmt.Sprintf("-j MARK --set-xmark %#x/0x0", m.cfg.Mark),
			masq,
		},
		netfilter.Filter(chainFilter): {
			"-m conntrack --ctstate DNAT -j RETURN",
			"-j " + chainReject,
		},
		netfilter.Filter(chainForward): {
			"-j " + chainFilter,
			"-m mark --mark " + mark + " -j ACCEPT",
			"-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
		},
		netfilter.Filter(chainReject):   nil,
		netfilter.Filter(chainNPReject): nil,
	}
	if m.nodePorts[fam] {
		rules[netfilter.Nat(chainServices)] = []string{np + " -j " + chainNodePorts}
		k := netfilter.Filter(chainFilter)
		rules[k] = append(rules[k], np+" -j "+chainNPReject)
	}
	return rules
}

// The sets, per family.
func hairpinSet(fam netfilter.Family) string {
	return setPrefix + "hairpin-" + netfilter.FamilySuffix(fam)
}

func npAddrsSet(fam netfilter.Family) string {
	return setPrefix + "npaddrs-" + netfilter.FamilySuffix(fam)
}

// canonicalCheck reports the first rule of rules that is not in the form
// iptables-save prints (tests call it; the generator must only ever write
// canonical rules, or full syncs would see tampering everywhere).
func canonicalCheck(fam netfilter.Family, rules []string) error {
	for _, r := range rules {
		c, err := netfilter.Canonical(fam, r)
		if err != nil {
			return fmt.Errorf("rule %q: %w", r, err)
		}
		if c != r {
			return fmt.Errorf("rule %q is not canonical: iptables-save prints %q", r, c)
		}
	}
	return nil
}
