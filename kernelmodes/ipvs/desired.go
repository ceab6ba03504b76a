package ipvs

import (
	"cmp"
	"fmt"
	"math"
	"net/netip"
	"syscall"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// ipprotoSCTP is IPPROTO_SCTP, which package syscall lacks on some of the
// systems svcproxy builds for.
const ipprotoSCTP = 132

// IPVS service flags (include/uapi/linux/ip_vs.h).
const (
	flagPersistent = 0x1
	flagHashed     = 0x2 // set by the kernel on every service it lists
)

// vsKey identifies a virtual server.
type vsKey struct {
	proto lb.Protocol
	addr  netip.AddrPort
}

func (k vsKey) String() string { return netfilter.ProtoName(k.proto) + "/" + k.addr.String() }

func (k vsKey) Compare(o vsKey) int {
	return cmp.Or(cmp.Compare(k.proto, o.proto), k.addr.Compare(o.addr))
}

// vsAttrs are the attributes of a virtual server svcproxy sets.
type vsAttrs struct {
	sched   string
	flags   uint32
	timeout uint32 // persistence, seconds
}

// vsWant is one virtual server as a snapshot asks for it.
type vsWant struct {
	attrs   vsAttrs
	dests   []netip.AddrPort // sorted, each with weight 1
	service lb.ServicePortName
}

// desired is everything one Apply should leave in the kernel.
type desired struct {
	vips    map[netip.Addr]struct{}
	vs      map[vsKey]*vsWant
	members map[member]struct{}
}

// compute translates snap into the desired state. Each virtual server gets
// the backends of its own family (IPVS cannot translate between families);
// frontends of a family that is off are skipped. A Service that cannot be
// programmed loses only what is affected; the errors name each.
func (m *Mode) compute(snap *lb.Snapshot, nodeIPs []netip.Addr) (*desired, []error) {
	d := &desired{
		vips:    make(map[netip.Addr]struct{}, snap.Len()),
		vs:      make(map[vsKey]*vsWant, snap.Len()),
		members: make(map[member]struct{}, 4*snap.Len()),
	}
	var errs []error
	for _, fam := range m.families {
		for _, ip := range nodeIPs {
			if familyOf(ip) == fam {
				d.members[member{set: famSet(setNodeIPs4, fam), ip: ip}] = struct{}{}
			}
		}
	}
	for _, bal := range snap.Balancers() {
		if bal == nil || bal.Service == nil {
			continue
		}
		svc := bal.Service
		if svc.Protocol > lb.SCTP {
			errs = append(errs, fmt.Errorf("service %v: unsupported protocol %v", svc.Name, svc.Protocol))
			continue
		}
		attrs := vsAttrs{sched: m.scheduler(svc)}
		if svc.AffinityTimeout > 0 {
			attrs.flags = flagPersistent
			attrs.timeout = uint32(min(math.Ceil(svc.AffinityTimeout.Seconds()), math.MaxUint32))
		}
		// virtualServer adds one virtual server at addr for pool and
		// reports whether it has real servers.
		virtualServer := func(addr netip.AddrPort, pool *lb.Pool) bool {
			w := &vsWant{attrs: attrs, service: svc.Name}
			fam := familyOf(addr.Addr())
			add := func(p *lb.Pool) {
				for _, b := range p.Backends() {
					ba := netip.AddrPortFrom(b.Addr.Addr().Unmap(), b.Addr.Port())
					if familyOf(ba.Addr()) != fam {
						continue // a dual-stack Service: the other family's frontends use it
					}
					w.dests = append(w.dests, ba)
					d.members[member{set: famSet(setLoop4, fam), ip: ba.Addr(), proto: svc.Protocol, port: ba.Port(), ip2: ba.Addr()}] = struct{}{}
				}
			}
			add(pool)
			if sc := pool.ShortCircuit(); len(w.dests) == 0 && sc != nil {
				// As kube-proxy's ipvs mode (kubernetes#97081): an
				// external frontend of a Local Service with no endpoint
				// here takes the Cluster policy's endpoints, for every
				// client (a virtual server cannot tell them apart), so
				// that pods and the node (masqueraded: its source is the
				// VIP) reach it. A client outside gets no answer, as there:
				// unmasqueraded, it is answered from the endpoint's node.
				add(sc)
			}
			d.vs[vsKey{svc.Protocol, addr}] = w
			return len(w.dests) > 0
		}
		// Only the frontends the snapshot gives this Service port: another
		// Service may have won some of them in a conflict.
		for fe, pool := range snap.Frontends(bal) {
			ip := fe.Addr.Addr()
			if !ip.IsValid() || pool == nil {
				continue
			}
			fam := familyOf(ip)
			if fam == IPv6 && !m.cfg.IPv6 {
				continue
			}
			d.vips[ip] = struct{}{}
			d.members[member{set: famSet(setVIPs4, fam), ip: ip}] = struct{}{}
			vs := member{set: famSet(setVS4, fam), ip: ip, proto: svc.Protocol, port: svc.Port}
			d.members[vs] = struct{}{}
			if !virtualServer(fe.Addr, pool) {
				vs.set = famSet(setReject4, fam)
				d.members[vs] = struct{}{}
			}
			// MasqueradeAll is kube-proxy's: the ClusterIPs (its
			// KUBE-CLUSTER-IP set); external traffic as without it.
			if (!pool.External && m.cfg.MasqueradeAll) || (pool.External && svc.ExternalTrafficPolicy == lb.PolicyCluster) {
				vs.set = famSet(setMasq4, fam)
				d.members[vs] = struct{}{}
			}
		}
		if snap.NodePort(bal) == 0 || bal.External == nil {
			continue // none, or another Service owns this NodePort
		}
		usable := false
		var sctpNodeIPs []netip.Addr
		for _, ip := range nodeIPs {
			if fam := familyOf(ip); fam == IPv6 && !m.cfg.IPv6 {
				continue
			}
			usable = virtualServer(netip.AddrPortFrom(ip, svc.NodePort), bal.External) || usable
			sctpNodeIPs = append(sctpNodeIPs, ip)
		}
		if len(nodeIPs) == 0 {
			usable = bal.External.Serves()
		}
		masq := svc.ExternalTrafficPolicy == lb.PolicyCluster
		if svc.Protocol == lb.SCTP {
			// bitmap:port never matches SCTP: one node IP,sctp:port
			// member per node IP instead, as kube-proxy does.
			for _, ip := range sctpNodeIPs {
				np := member{ip: ip, proto: lb.SCTP, port: svc.NodePort}
				if !usable {
					np.set = famSet(setNPRejectSCTP4, familyOf(ip))
					d.members[np] = struct{}{}
				}
				if masq {
					np.set = famSet(setNPMasqSCTP4, familyOf(ip))
					d.members[np] = struct{}{}
				}
			}
			continue
		}
		np := member{port: svc.NodePort}
		switch {
		case !usable && svc.Protocol == lb.TCP:
			np.set = setNPRejectTCP
		case !usable:
			np.set = setNPRejectUDP
		}
		if !usable {
			d.members[np] = struct{}{}
		}
		if masq {
			np.set = setNPMasqTCP
			if svc.Protocol == lb.UDP {
				np.set = setNPMasqUDP
			}
			d.members[np] = struct{}{}
		}
	}
	return d, errs
}

// scheduler is the IPVS scheduler for svc: the one matching the algorithm
// the Service names, else Config.Scheduler.
func (m *Mode) scheduler(svc *lb.Service) string {
	switch svc.Algorithm {
	case lb.RoundRobin:
		return "rr"
	case lb.LeastConn:
		return "lc"
	case lb.Maglev:
		return "mh"
	}
	// AlgorithmDefault, and Random, which IPVS does not have.
	return m.cfg.Scheduler
}

// toService is the moby/ipvs form of a virtual server.
func toService(k vsKey, a vsAttrs) *Service {
	s := &Service{
		Address:   k.addr.Addr().AsSlice(),
		Protocol:  syscall.IPPROTO_TCP,
		Port:      k.addr.Port(),
		SchedName: a.sched,
		Flags:     a.flags,
		Timeout:   a.timeout,
	}
	switch k.proto {
	case lb.UDP:
		s.Protocol = syscall.IPPROTO_UDP
	case lb.SCTP:
		s.Protocol = ipprotoSCTP
	}
	if k.addr.Addr().Is4() {
		s.AddressFamily = syscall.AF_INET
		s.Netmask = 0xffffffff
	} else {
		s.AddressFamily = syscall.AF_INET6
		s.Netmask = 128
	}
	return s
}

// fromService reads a virtual server the kernel listed. ok is false for one
// svcproxy never makes (firewall-mark based, other protocols).
func fromService(s *Service) (vsKey, vsAttrs, bool) {
	var k vsKey
	switch s.Protocol {
	case syscall.IPPROTO_TCP:
		k.proto = lb.TCP
	case syscall.IPPROTO_UDP:
		k.proto = lb.UDP
	case ipprotoSCTP:
		k.proto = lb.SCTP
	default:
		return k, vsAttrs{}, false
	}
	if s.FWMark != 0 {
		return k, vsAttrs{}, false
	}
	a, ok := netip.AddrFromSlice(s.Address)
	if !ok {
		return k, vsAttrs{}, false
	}
	k.addr = netip.AddrPortFrom(a.Unmap(), s.Port)
	return k, vsAttrs{sched: s.SchedName, flags: s.Flags &^ flagHashed, timeout: s.Timeout}, true
}

func toDestination(a netip.AddrPort, weight int) *Destination {
	d := &Destination{
		Address:         a.Addr().AsSlice(),
		Port:            a.Port(),
		Weight:          weight,
		ConnectionFlags: connectionFlagMasq,
		AddressFamily:   syscall.AF_INET,
	}
	if a.Addr().Is6() {
		d.AddressFamily = syscall.AF_INET6
	}
	return d
}

func destAddr(d *Destination) (netip.AddrPort, bool) {
	a, ok := netip.AddrFromSlice(d.Address)
	if !ok {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(a.Unmap(), d.Port), true
}
