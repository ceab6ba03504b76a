package lb

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Protocol is a Service port's transport protocol.
type Protocol uint8

// The protocols of Service ports. The zero value is TCP, as in Kubernetes.
// SCTP is served by the kernel modes only: the userspace forwarder has no
// SCTP sockets (Go has none) and leaves SCTP Service ports unserved.
const (
	TCP Protocol = iota
	UDP
	SCTP
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	case SCTP:
		return "SCTP"
	}
	return fmt.Sprintf("Protocol(%d)", uint8(p))
}

// ParseProtocol accepts "TCP", "UDP" or "SCTP" in any case; "" means TCP.
func ParseProtocol(s string) (Protocol, error) {
	switch strings.ToUpper(s) {
	case "", "TCP":
		return TCP, nil
	case "UDP":
		return UDP, nil
	case "SCTP":
		return SCTP, nil
	}
	return 0, fmt.Errorf("unsupported protocol %q (want TCP, UDP or SCTP)", s)
}

// ServicePortName names one port of one Service: the unit every mode balances.
type ServicePortName struct {
	Namespace string
	Name      string
	Port      string // the Service port's name; "" for an unnamed single port
}

func (n ServicePortName) String() string {
	if n.Port == "" {
		return n.Namespace + "/" + n.Name
	}
	return n.Namespace + "/" + n.Name + ":" + n.Port
}

// Compare orders names by namespace, name, then port.
func (n ServicePortName) Compare(o ServicePortName) int {
	return cmp.Or(cmp.Compare(n.Namespace, o.Namespace), cmp.Compare(n.Name, o.Name), cmp.Compare(n.Port, o.Port))
}

// TrafficPolicy is a Service's internal or external traffic policy.
type TrafficPolicy uint8

// The zero value is Cluster, as in Kubernetes.
const (
	PolicyCluster TrafficPolicy = iota
	PolicyLocal
)

func (p TrafficPolicy) String() string {
	if p == PolicyLocal {
		return "Local"
	}
	return "Cluster"
}

// Algorithm is how a pool picks among its usable backends.
type Algorithm uint8

// The pickers. AlgorithmDefault means the Store's default (round robin unless
// configured otherwise).
const (
	AlgorithmDefault Algorithm = iota
	RoundRobin
	Random
	LeastConn // least connections by power of two random choices
	Maglev    // consistent hashing of the client IP
)

var algorithmNames = [...]string{"", "round-robin", "random", "least-conn", "maglev"}

func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		if a == AlgorithmDefault {
			return "default"
		}
		return algorithmNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// ParseAlgorithm accepts round-robin (rr), random, least-conn (lc) or maglev;
// "" means the default.
func ParseAlgorithm(s string) (Algorithm, error) {
	switch strings.ToLower(s) {
	case "":
		return AlgorithmDefault, nil
	case "round-robin", "rr":
		return RoundRobin, nil
	case "random":
		return Random, nil
	case "least-conn", "lc":
		return LeastConn, nil
	case "maglev", "mh":
		return Maglev, nil
	}
	return 0, fmt.Errorf("unknown algorithm %q (want round-robin, random, least-conn or maglev)", s)
}

// DefaultAffinityTimeout is Kubernetes' default ClientIP affinity timeout.
const DefaultAffinityTimeout = 10800 * time.Second

// Service is one port of one Kubernetes Service with its endpoints: plain,
// immutable input data. Sources build it; nothing mutates it afterwards.
type Service struct {
	Name     ServicePortName
	Protocol Protocol
	Port     uint16 // the port on ClusterIPs, ExternalIPs and LoadBalancer IPs

	ClusterIPs      []netip.Addr
	NodePort        uint16 // 0: none
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr

	// LoadBalancerSourceRanges (spec.loadBalancerSourceRanges), if any,
	// are the only sources traffic to the LoadBalancerIPs may come from,
	// each range applying to the addresses of its family. A family with no
	// range here, or with a /0 among them, is open to every source, as in
	// kube-proxy. ClusterIPs, ExternalIPs and the NodePort are not
	// restricted. Sources keep them masked (netip.Prefix.Masked).
	LoadBalancerSourceRanges []netip.Prefix

	// HealthCheckNodePort is the Service's health-check node port
	// (spec.healthCheckNodePort of a LoadBalancer Service with
	// externalTrafficPolicy Local), the same on each of its ports; 0: none.
	HealthCheckNodePort uint16

	// AffinityTimeout > 0 turns on ClientIP session affinity with that timeout.
	AffinityTimeout time.Duration

	InternalTrafficPolicy TrafficPolicy // for ClusterIP traffic
	ExternalTrafficPolicy TrafficPolicy // for NodePort, ExternalIP and LoadBalancer traffic

	Algorithm Algorithm

	// FirstByteTimeout > 0 fails a userspace TCP connection whose backend
	// has sent nothing this long after the client's first bytes reached
	// it: the client is reset and the backend charged a failure, so passive
	// health stops sending it new connections. Only for protocols where the
	// client speaks first and the server answers promptly (HTTP, gRPC, DNS
	// over TCP): it breaks server-speaks-first protocols (SMTP, MySQL) and
	// long polls. The kernel modes ignore it.
	FirstByteTimeout time.Duration

	Endpoints []Endpoint
}

// Endpoint is one backend of a Service port, with the conditions of its
// EndpointSlice entry.
type Endpoint struct {
	Addr        netip.AddrPort
	Ready       bool
	Serving     bool
	Terminating bool
	NodeName    string
	Zone        string
	ZoneHints   []string // topology hints: zones this endpoint should serve
	NodeHints   []string // topology hints: nodes this endpoint should serve (trafficDistribution PreferSameNode)
}

// Validate reports every problem with s, each naming the field.
func (s *Service) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if s.Name.Namespace == "" {
		bad("namespace", "must not be empty")
	}
	if s.Name.Name == "" {
		bad("name", "must not be empty")
	}
	if s.Protocol > SCTP {
		bad("protocol", "unsupported protocol %v", s.Protocol)
	}
	if s.Port == 0 {
		bad("port", "must be in 1-65535")
	}
	if len(s.ClusterIPs)+len(s.ExternalIPs)+len(s.LoadBalancerIPs) == 0 && s.NodePort == 0 {
		bad("clusterIPs", "a service needs at least one of clusterIPs, externalIPs, loadBalancerIPs or nodePort")
	}
	checkIPs := func(field string, ips []netip.Addr) {
		for i, ip := range ips {
			if u := ip.Unmap(); !u.IsValid() || u.IsUnspecified() || u.IsMulticast() { // ::ffff:0.0.0.0 is 0.0.0.0
				bad(fmt.Sprintf("%s[%d]", field, i), "invalid address %v", ip)
			}
		}
	}
	checkIPs("clusterIPs", s.ClusterIPs)
	checkIPs("externalIPs", s.ExternalIPs)
	checkIPs("loadBalancerIPs", s.LoadBalancerIPs)
	for i, p := range s.LoadBalancerSourceRanges {
		if !p.IsValid() || p != p.Masked() {
			bad(fmt.Sprintf("loadBalancerSourceRanges[%d]", i), "invalid or unmasked range %v", p)
		}
	}
	if s.AffinityTimeout < 0 {
		bad("sessionAffinityTimeout", "must not be negative")
	}
	if s.InternalTrafficPolicy > PolicyLocal {
		bad("internalTrafficPolicy", "unknown policy %d", s.InternalTrafficPolicy)
	}
	if s.ExternalTrafficPolicy > PolicyLocal {
		bad("externalTrafficPolicy", "unknown policy %d", s.ExternalTrafficPolicy)
	}
	if s.FirstByteTimeout < 0 {
		bad("firstByteTimeout", "must not be negative")
	}
	if s.Algorithm > Maglev {
		bad("algorithm", "unknown algorithm %d", s.Algorithm)
	}
	seen := make(map[netip.AddrPort]bool, len(s.Endpoints))
	for i, ep := range s.Endpoints {
		field := fmt.Sprintf("endpoints[%d]", i)
		// The Store unmaps endpoint addresses, so an IPv4 endpoint and
		// its IPv4-mapped IPv6 form are the same backend.
		key := netip.AddrPortFrom(ep.Addr.Addr().Unmap(), ep.Addr.Port())
		switch {
		case !key.Addr().IsValid() || key.Addr().IsUnspecified() || key.Addr().IsMulticast():
			bad(field+".address", "invalid address %v", ep.Addr.Addr())
		case ep.Addr.Port() == 0:
			bad(field+".port", "must be in 1-65535")
		case seen[key]:
			bad(field+".address", "duplicate endpoint %v", ep.Addr)
		}
		seen[key] = true
	}
	return errors.Join(errs...)
}

// Frontend is an address and port a Service is reachable on.
type Frontend struct {
	Protocol Protocol
	Addr     netip.AddrPort
}

func (f Frontend) String() string { return f.Protocol.String() + "/" + f.Addr.String() }

// frontends yields every fixed frontend of s (not its NodePort, which is on
// every node address), saying whether it is an external one, until yield
// returns false. A LoadBalancer IP that is also a ClusterIP or an
// ExternalIP of s is served once, as that (clouds report such ingress
// IPs); it stays a LoadBalancer IP for AllowedSources.
func (s *Service) frontends(yield func(f Frontend, external bool) bool) {
	for _, ip := range s.ClusterIPs {
		if !yield(Frontend{s.Protocol, netip.AddrPortFrom(ip, s.Port)}, false) {
			return
		}
	}
	for _, ip := range s.ExternalIPs {
		if !yield(Frontend{s.Protocol, netip.AddrPortFrom(ip, s.Port)}, true) {
			return
		}
	}
	for _, ip := range s.LoadBalancerIPs {
		if slices.Contains(s.ClusterIPs, ip) || slices.Contains(s.ExternalIPs, ip) {
			continue
		}
		if !yield(Frontend{s.Protocol, netip.AddrPortFrom(ip, s.Port)}, true) {
			return
		}
	}
}

// AllowedSources returns the sources that traffic to lbIP, one of s's
// LoadBalancerIPs, may come from; nil means every source. They are the
// LoadBalancerSourceRanges of lbIP's family, unless one of them is a /0 or
// there are none, and, when one of the ranges holds one of nodeIPs (the
// node's own addresses), every LoadBalancer IP of s of lbIP's family: a
// VIP-style load balancer's IP is often local on the node, so a request
// from the node loops back with it as the source (kube-proxy allows them
// the same way).
func (s *Service) AllowedSources(lbIP netip.Addr, nodeIPs []netip.Addr) []netip.Prefix {
	lbIP = lbIP.Unmap()
	var out []netip.Prefix
	fromNode := false
	for _, r := range s.LoadBalancerSourceRanges {
		if r.Addr().Is4() != lbIP.Is4() {
			continue
		}
		if r.Bits() == 0 {
			return nil
		}
		out = append(out, r)
		for _, n := range nodeIPs {
			fromNode = fromNode || r.Contains(n.Unmap())
		}
	}
	if fromNode {
		for _, ip := range s.LoadBalancerIPs {
			if ip = ip.Unmap(); ip.Is4() == lbIP.Is4() {
				out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
			}
		}
	}
	return out
}

// SourceRange is a loadBalancerSourceRanges entry as a Service holds it:
// masked, and an IPv4-mapped IPv6 range as the IPv4 range it maps.
func SourceRange(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p.Masked()
}

// equal reports whether s and o are the same Service port, field by field.
func (s *Service) equal(o *Service) bool {
	return s.Name == o.Name && s.Protocol == o.Protocol && s.Port == o.Port &&
		slices.Equal(s.ClusterIPs, o.ClusterIPs) && s.NodePort == o.NodePort &&
		slices.Equal(s.ExternalIPs, o.ExternalIPs) && slices.Equal(s.LoadBalancerIPs, o.LoadBalancerIPs) &&
		slices.Equal(s.LoadBalancerSourceRanges, o.LoadBalancerSourceRanges) &&
		s.HealthCheckNodePort == o.HealthCheckNodePort && s.AffinityTimeout == o.AffinityTimeout &&
		s.InternalTrafficPolicy == o.InternalTrafficPolicy && s.ExternalTrafficPolicy == o.ExternalTrafficPolicy &&
		s.Algorithm == o.Algorithm && s.FirstByteTimeout == o.FirstByteTimeout &&
		slices.EqualFunc(s.Endpoints, o.Endpoints, Endpoint.equal)
}

func (e Endpoint) equal(o Endpoint) bool {
	return e.Addr == o.Addr && e.Ready == o.Ready && e.Serving == o.Serving && e.Terminating == o.Terminating &&
		e.NodeName == o.NodeName && e.Zone == o.Zone && slices.Equal(e.ZoneHints, o.ZoneHints) && slices.Equal(e.NodeHints, o.NodeHints)
}
