package redirect

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// The chains svcproxy owns, and the builtin chains that jump to them.
const (
	chainServices  = "SVCPROXY-SERVICES"
	chainUDP       = "SVCPROXY-UDP"
	chainNodePorts = "SVCPROXY-NODEPORTS"
	chainNPUDP     = "SVCPROXY-NP-UDP"
	chainReject    = "SVCPROXY-REJECT"
)

type chainKey = netfilter.ChainKey

// ourJumps are the rules "-j To" at the top of builtin chains.
var ourJumps = slices.Concat(
	netfilter.Jumps("nat", chainServices, "PREROUTING", "OUTPUT"),
	netfilter.Jumps("filter", chainReject, "INPUT", "FORWARD", "OUTPUT"),
)

// udpRedirect steers one UDP frontend (or NodePort, when dst is not valid)
// to its forwarder socket.
type udpRedirect struct {
	dst  netip.Addr // invalid for a NodePort
	port uint16     // the frontend port or NodePort
	to   uint16
}

// frontend is the UDP frontend (or NodePort, keyed by the family's
// unspecified address) r steers.
func (r udpRedirect) frontend(fam netfilter.Family) lb.Frontend {
	dst := r.dst
	if !dst.IsValid() {
		dst = unspecified(fam)
	}
	return lb.Frontend{Protocol: lb.UDP, Addr: netip.AddrPortFrom(dst, r.port)}
}

// desired is everything one Apply of the iptables backend should leave in
// the kernel.
type desired struct {
	members map[member]struct{}
	// rules holds, per family, the rules of each of its chains.
	rules [2]map[chainKey][]string
	// udp is the port each steered UDP frontend is redirected to.
	udp map[lb.Frontend]uint16
}

// target is one frontend (or a NodePort in one family) of the snapshot to
// steer or reject, whatever writes the rules.
type target struct {
	fam      netfilter.Family
	nodePort bool       // addr is the family's unspecified address
	addr     netip.Addr // the frontend address
	proto    lb.Protocol
	port     uint16 // the frontend port or NodePort
	// to is the forwarder port to steer to: the TCP redirect port, or the
	// UDP frontend's socket (0: none, only when not steered).
	to uint16
	// usable: the pool has endpoints, so steer; else reject.
	usable bool
	// short: the pool has none, but its short circuit has (a Local
	// external frontend whose endpoints all run elsewhere): steer clients
	// inside the cluster (Config.ClusterCIDRs, the node itself), reject
	// the rest.
	short bool
}

// steered says whether x is steered, for some clients at least.
func (x target) steered() bool { return x.usable || x.short }

// targetOf is pool's target, for frontend address a (the family's
// unspecified address for a NodePort) and port.
func targetOf(fam netfilter.Family, a netip.Addr, svc *lb.Service, port, to uint16, pool *lb.Pool) target {
	usable := len(pool.Backends()) > 0
	return target{fam: fam, addr: a, nodePort: a.IsUnspecified(), proto: svc.Protocol, port: port, to: to,
		usable: usable, short: !usable && pool.Serves()}
}

// walk calls visit with every frontend and NodePort of snap svcproxy steers
// (TCP and UDP; SCTP is left alone) or rejects, in r's families. A Service
// that cannot be programmed (an unsupported protocol, a UDP frontend with
// endpoints but no forwarder port) loses only the affected frontends; the
// error names each.
func (r *Redirector) walk(snap *lb.Snapshot, ports Ports, visit func(target)) []error {
	var errs []error
	for _, bal := range snap.Balancers() {
		errs = r.walkBalancer(snap, bal, ports, visit, errs)
	}
	return errs
}

// walkBalancer is walk for one Service port; it appends its errors to errs.
func (r *Redirector) walkBalancer(snap *lb.Snapshot, bal *lb.Balancer, ports Ports, visit func(target), errs []error) []error {
	if bal == nil || bal.Service == nil {
		return errs
	}
	svc := bal.Service
	if svc.Protocol == lb.SCTP {
		// The forwarder cannot serve SCTP (no SCTP sockets), so SCTP
		// frontends are left unsteered: neither redirected nor rejected,
		// their packets go on as if svcproxy were not there. The forwarder
		// warns once per Service port.
		return errs
	}
	if svc.Protocol != lb.TCP && svc.Protocol != lb.UDP {
		return append(errs, fmt.Errorf("service %v: unsupported protocol %v", svc.Name, svc.Protocol))
	}
	// Only the frontends the snapshot gives this Service port: another
	// Service may have won some of them in a conflict.
	for fe, pool := range snap.Frontends(bal) {
		ip := fe.Addr.Addr()
		if !ip.IsValid() || pool == nil {
			continue
		}
		fam := familyOf(ip)
		if fam == netfilter.IPv6 && !r.cfg.IPv6 {
			continue
		}
		x := targetOf(fam, ip, svc, svc.Port, ports.TCP, pool)
		if svc.Protocol == lb.UDP {
			if x.to = ports.UDP[fe]; x.to == 0 && x.steered() {
				errs = append(errs, fmt.Errorf("service %v: frontend %v: no forwarder port for it", svc.Name, fe))
				continue
			}
		}
		visit(x)
	}
	pool := bal.External
	if snap.NodePort(bal) == 0 || pool == nil {
		return errs // none, or another Service owns this NodePort
	}
	for _, fam := range r.families {
		x := targetOf(fam, unspecified(fam), svc, svc.NodePort, ports.TCP, pool)
		if svc.Protocol == lb.UDP {
			// Each family's UDP NodePort has its own socket; a family
			// without one is not steered.
			fe := lb.Frontend{Protocol: lb.UDP, Addr: netip.AddrPortFrom(x.addr, svc.NodePort)}
			if x.to = ports.UDP[fe]; x.to == 0 && x.steered() {
				errs = append(errs, fmt.Errorf("service %v: nodePort %v: no forwarder port for it", svc.Name, fe))
				continue
			}
		}
		visit(x)
	}
	return errs
}

// compute translates snap and ports into the desired state of the iptables
// backend.
func (r *Redirector) compute(snap *lb.Snapshot, ports Ports, spare map[member]struct{}) (*desired, []error) {
	d := &desired{members: spare}
	if d.members == nil {
		d.members = make(map[member]struct{}, snap.Len()+16)
	}
	var udp, npUDP [2][]udpRedirect
	errs := r.walk(snap, ports, func(x target) {
		if x.proto == lb.UDP && x.to != 0 {
			if x.nodePort {
				npUDP[x.fam] = append(npUDP[x.fam], udpRedirect{port: x.port, to: x.to})
			} else {
				udp[x.fam] = append(udp[x.fam], udpRedirect{dst: x.addr, port: x.port, to: x.to})
			}
		}
		if !x.nodePort {
			set := rejectSet(x.fam)
			if x.usable {
				set = svcSet(x.fam)
			}
			d.members[addrMember(set, x.addr, x.proto, x.port)] = struct{}{}
			if x.short { // rejected too, unless steered from inside
				d.members[addrMember(shortSet(x.fam), x.addr, x.proto, x.port)] = struct{}{}
			}
			return
		}
		// The NodePort sets serve both families.
		var set setID
		switch {
		case x.usable && x.proto == lb.TCP:
			set = setNPTCP
		case x.usable:
			set = setNPUDP
		case x.proto == lb.TCP:
			set = setNPRejectTCP
		default:
			set = setNPRejectUDP
		}
		d.members[member{set: set, port: x.port}] = struct{}{}
		if x.short {
			set = setNPShortUDP
			if x.proto == lb.TCP {
				set = setNPShortTCP
			}
			d.members[member{set: set, port: x.port}] = struct{}{}
		}
	})
	d.udp = make(map[lb.Frontend]uint16)
	for _, fam := range r.families {
		for _, x := range slices.Concat(udp[fam], npUDP[fam]) {
			d.udp[x.frontend(fam)] = x.to
		}
		if r.npRestricted[fam] {
			for _, p := range r.npAddrs[fam] {
				d.members[netMember(npAddrsSet(fam), p)] = struct{}{}
			}
		}
		for _, p := range r.inside[fam] {
			d.members[netMember(insideSet(fam), p)] = struct{}{}
		}
		d.rules[fam] = r.chainRules(fam, ports.TCP, udp[fam], npUDP[fam])
	}
	return d, errs
}

func familyOf(a netip.Addr) netfilter.Family { return netfilter.FamilyOf(a) }

func unspecified(f netfilter.Family) netip.Addr {
	if f == netfilter.IPv6 {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}

// steerTo is the target that steers to forwarder port port in fam: a DNAT
// to the family's node address (Config.NodeIPs), else REDIRECT.
func (r *Redirector) steerTo(fam netfilter.Family, port uint16) string {
	if a := r.to[fam]; a.IsValid() {
		return "DNAT --to-destination " + netip.AddrPortFrom(a, port).String()
	}
	return "REDIRECT --to-ports " + strconv.Itoa(int(port))
}

// chainRules renders the rules of each chain for one family, in
// iptables-save's canonical form.
func (r *Redirector) chainRules(fam netfilter.Family, tcpPort uint16, udp, npUDP []udpRedirect) map[chainKey][]string {
	mark := fmt.Sprintf("-m mark --mark %#x/%#x -j RETURN", r.cfg.Mark, r.cfg.Mark)
	svc, reject := setDefs[svcSet(fam)].Name, setDefs[rejectSet(fam)].Name
	to := r.steerTo(fam, tcpPort)
	local := "-m addrtype --dst-type LOCAL"
	if r.npRestricted[fam] {
		local += " -m set --match-set " + setDefs[npAddrsSet(fam)].Name + " dst"
	}
	unreachable := "icmp-port-unreachable"
	if fam == netfilter.IPv6 {
		unreachable = "icmp6-port-unreachable"
	}
	// A short-circuit frontend (or NodePort) is steered for a client
	// inside the cluster: a source in the cluster CIDRs, or the node.
	short, inside := setDefs[shortSet(fam)].Name, setDefs[insideSet(fam)].Name
	fromInside := []string{"-m set --match-set " + inside + " src", "-m addrtype --src-type LOCAL"}
	services := []string{
		mark,
		"-p tcp -m set --match-set " + svc + " dst,dst -j " + to,
		"-p udp -m set --match-set " + svc + " dst,dst -j " + chainUDP,
	}
	nodePorts := []string{
		"-p tcp -m set --match-set " + setDefs[setNPTCP].Name + " dst -j " + to,
		"-p udp -m set --match-set " + setDefs[setNPUDP].Name + " dst -j " + chainNPUDP,
	}
	for _, src := range fromInside {
		services = append(services,
			"-p tcp -m set --match-set "+short+" dst,dst "+src+" -j "+to,
			"-p udp -m set --match-set "+short+" dst,dst "+src+" -j "+chainUDP)
		nodePorts = append(nodePorts,
			"-p tcp -m set --match-set "+setDefs[setNPShortTCP].Name+" dst "+src+" -j "+to,
			"-p udp -m set --match-set "+setDefs[setNPShortUDP].Name+" dst "+src+" -j "+chainNPUDP)
	}
	services = append(services,
		"-m set --match-set "+reject+" dst,dst -j RETURN",
		local+" -j "+chainNodePorts)
	rules := map[chainKey][]string{
		netfilter.Nat(chainServices):  services,
		netfilter.Nat(chainNodePorts): nodePorts,
		netfilter.Filter(chainReject): {
			mark,
			"-m conntrack --ctstate DNAT -j RETURN",
			"-p tcp -m set --match-set " + reject + " dst,dst -j REJECT --reject-with tcp-reset",
			"-p udp -m set --match-set " + reject + " dst,dst -j REJECT --reject-with " + unreachable,
			"-p tcp " + local + " -m set --match-set " + setDefs[setNPRejectTCP].Name + " dst -j REJECT --reject-with tcp-reset",
			"-p udp " + local + " -m set --match-set " + setDefs[setNPRejectUDP].Name + " dst -j REJECT --reject-with " + unreachable,
		},
	}
	// The UDP frontends' own sockets listen on the node's every address
	// (a REDIRECT'ed datagram arrives at the incoming interface's
	// address, a DNATed one at the node address): a datagram sent to one
	// of those ports directly, not steered by nat, is dropped, so a
	// ClusterIP-only Service is not reachable at the node's addresses.
	var toPorts []uint16
	for _, x := range slices.Concat(udp, npUDP) {
		toPorts = append(toPorts, x.to)
	}
	slices.Sort(toPorts)
	for _, p := range slices.Compact(toPorts) {
		rules[netfilter.Filter(chainReject)] = append(rules[netfilter.Filter(chainReject)],
			fmt.Sprintf("-p udp -m udp --dport %d -m addrtype --dst-type LOCAL -j DROP", p))
	}
	sortUDP := func(u []udpRedirect) []udpRedirect {
		slices.SortFunc(u, func(a, b udpRedirect) int {
			return cmp.Or(a.dst.Compare(b.dst), cmp.Compare(a.port, b.port), cmp.Compare(a.to, b.to))
		})
		return slices.CompactFunc(u, func(a, b udpRedirect) bool { return a.dst == b.dst && a.port == b.port })
	}
	var u []string
	for _, x := range sortUDP(udp) {
		u = append(u, fmt.Sprintf("-d %v -p udp -m udp --dport %d -j %s",
			netip.PrefixFrom(x.dst, x.dst.BitLen()), x.port, r.steerTo(fam, x.to)))
	}
	rules[netfilter.Nat(chainUDP)] = u
	var n []string
	for _, x := range sortUDP(npUDP) {
		n = append(n, fmt.Sprintf("-p udp -m udp --dport %d -j %s", x.port, r.steerTo(fam, x.to)))
	}
	rules[netfilter.Nat(chainNPUDP)] = n
	// Canonicalise through the parser, so what we compare with
	// iptables-save output is what it prints.
	for k, rs := range rules {
		for i, s := range rs {
			if c, err := netfilter.Canonical(fam, s); err == nil {
				rs[i] = c
			}
		}
		rules[k] = rs
	}
	return rules
}
