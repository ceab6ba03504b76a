package kube

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	netutils "k8s.io/utils/net"

	"github.com/svcproxy/svcproxy/lb"
)

// Labels and annotations svcproxy reads, with kube-proxy's meaning.
const (
	// LabelServiceProxyName on a Service hands it to another proxy: svcproxy
	// ignores it unless it names svcproxy's own Options.ProxyName.
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	// LabelHeadless marks EndpointSlices of headless Services.
	LabelHeadless = v1.IsHeadlessService
	// AnnotationProxyMode on the Node asks for a proxy mode
	// (userspace, iptables, ipvs or nftables) when none is configured.
	AnnotationProxyMode = "net.experimental.kubernetes.io/proxy-mode"
	// AnnotationFirstByteTimeout on a Service (a duration, e.g. "2s") fails
	// a userspace TCP connection whose backend sends nothing that long
	// after the client's first bytes, charging the backend
	// (lb.Service.FirstByteTimeout). svcproxy's own, opt-in.
	AnnotationFirstByteTimeout = "svcproxy.io/first-byte-timeout"
)

// Limits the API server enforces; objects beyond them are corrupt.
const (
	// MaxEndpointsPerSlice is the API's bound on endpoints in one slice.
	MaxEndpointsPerSlice = 1000
	// MaxAffinitySeconds bounds sessionAffinityConfig.clientIP.timeoutSeconds.
	MaxAffinitySeconds = 86400
)

// InvalidError is one problem with one object: what Convert dropped and why.
type InvalidError struct {
	Kind      string // "Service" or "EndpointSlice"
	Namespace string
	Name      string
	Field     string // the field path, e.g. "spec.ports[1].port"
	Reason    string
}

func (e *InvalidError) Error() string {
	return fmt.Sprintf("%s %s/%s: %s: %s", e.Kind, e.Namespace, e.Name, e.Field, e.Reason)
}

// Skipped reports why svcproxy does not proxy svc at all, or "" when it
// does: headless and ExternalName Services (as kube-proxy), and Services
// labelled for another proxy (proxyName is svcproxy's own name: only
// Services labelled with it are served then; "" serves the unlabelled ones).
func Skipped(svc *v1.Service, proxyName string) string {
	if name, labelled := svc.Labels[LabelServiceProxyName]; labelled != (proxyName != "") || name != proxyName {
		if labelled {
			return fmt.Sprintf("labelled %s=%q", LabelServiceProxyName, name)
		}
		return fmt.Sprintf("not labelled %s=%q", LabelServiceProxyName, proxyName)
	}
	if svc.Spec.Type == v1.ServiceTypeExternalName {
		return "type ExternalName"
	}
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == v1.ClusterIPNone {
		return "headless"
	}
	return ""
}

// Convert turns svc and its EndpointSlices into one lb.Service per Service
// port, sorted by port name. slices may hold slices of other Services; only
// those labelled kubernetes.io/service-name=svc.Name in svc's namespace are
// used. proxyName is as for Skipped; a skipped Service converts to nothing.
//
// Every lb.Service returned passes Validate. Problems come back as
// *InvalidError values, each dropping the smallest thing it spoils: an IP, an
// endpoint, a slice port, a whole slice (beyond the API's limits), or a
// Service port left with no frontend. Endpoints are matched to Service ports
// by port name and protocol; an address listed twice (in one slice or across
// slices) counts once, the entry on this node winning (as kube-proxy).
func Convert(svc *v1.Service, slices []*discovery.EndpointSlice, proxyName, nodeName string) ([]lb.Service, []error) {
	if svc == nil || Skipped(svc, proxyName) != "" {
		return nil, nil
	}
	c := &converter{svc: svc}
	if svc.Namespace == "" || svc.Name == "" { // the API server never sends one; a broken relay might
		c.bad("metadata", "namespace and name must not be empty")
		return nil, c.errs
	}
	frontends := c.frontends()
	byPort := c.endpoints(slices, nodeName)

	var out []lb.Service
	seenName := map[string]int{}
	seenPort := map[lb.Frontend]int{}
	seenNodePort := map[lb.Frontend]int{}
	for i := range svc.Spec.Ports {
		sp := &svc.Spec.Ports[i]
		field := fmt.Sprintf("spec.ports[%d]", i)
		proto, err := lb.ParseProtocol(string(sp.Protocol))
		if err != nil {
			c.bad(field+".protocol", "%v; port not proxied", err)
			continue
		}
		if sp.Port < 1 || sp.Port > 65535 {
			c.bad(field+".port", "%d is not in 1-65535", sp.Port)
			continue
		}
		if j, dup := seenName[sp.Name]; dup {
			c.bad(field+".name", "duplicate port name %q (also spec.ports[%d])", sp.Name, j)
			continue
		}
		key := lb.Frontend{Protocol: proto, Addr: netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(sp.Port))}
		if j, dup := seenPort[key]; dup {
			c.bad(field+".port", "duplicate port %v/%d (also spec.ports[%d])", proto, sp.Port, j)
			continue
		}
		seenName[sp.Name], seenPort[key] = i, i

		s := frontends
		s.Name = lb.ServicePortName{Namespace: svc.Namespace, Name: svc.Name, Port: sp.Name}
		s.Protocol = proto
		s.Port = uint16(sp.Port)
		if svc.Spec.Type == v1.ServiceTypeNodePort || svc.Spec.Type == v1.ServiceTypeLoadBalancer {
			np := lb.Frontend{Protocol: proto, Addr: netip.AddrPortFrom(netip.IPv6Unspecified(), uint16(sp.NodePort))}
			switch j, dup := seenNodePort[np]; {
			case sp.NodePort == 0:
			case sp.NodePort < 1 || sp.NodePort > 65535:
				c.bad(field+".nodePort", "%d is not in 1-65535", sp.NodePort)
			case dup:
				c.bad(field+".nodePort", "duplicate nodePort %v/%d (also spec.ports[%d])", proto, sp.NodePort, j)
			default:
				s.NodePort = uint16(sp.NodePort)
				seenNodePort[np] = i
			}
		}
		if len(s.ClusterIPs)+len(s.ExternalIPs)+len(s.LoadBalancerIPs) == 0 && s.NodePort == 0 {
			c.bad(field, "no valid clusterIP, externalIP, load balancer IP or nodePort; port not proxied")
			continue
		}
		s.Endpoints = byPort[portKey{sp.Name, proto}]
		out = append(out, s)
	}
	slicesSortByName(out)
	return out, c.errs
}

func slicesSortByName(s []lb.Service) {
	slices.SortFunc(s, func(a, b lb.Service) int { return a.Name.Compare(b.Name) })
}

type converter struct {
	svc  *v1.Service
	errs []error
}

func (c *converter) bad(field, format string, args ...any) {
	c.errs = append(c.errs, &InvalidError{Kind: "Service", Namespace: c.svc.Namespace, Name: c.svc.Name, Field: field, Reason: fmt.Sprintf(format, args...)})
}

func (c *converter) badSlice(es *discovery.EndpointSlice, field, format string, args ...any) {
	c.errs = append(c.errs, &InvalidError{Kind: "EndpointSlice", Namespace: es.Namespace, Name: es.Name, Field: field, Reason: fmt.Sprintf(format, args...)})
}

// frontends returns the Service-wide fields every port shares.
func (c *converter) frontends() lb.Service {
	spec := &c.svc.Spec
	var s lb.Service

	used := map[netip.Addr]bool{} // one address is one frontend per port

	// ClusterIPs, checked against ipFamilies when both are given.
	ips := spec.ClusterIPs
	if len(ips) == 0 {
		ips = []string{spec.ClusterIP}
	}
	for i, str := range ips {
		field := fmt.Sprintf("spec.clusterIPs[%d]", i)
		ip, ok := c.addr(field, str)
		if !ok {
			continue
		}
		if i < len(spec.IPFamilies) && len(spec.IPFamilies) == len(ips) && !familyMatches(spec.IPFamilies[i], ip) {
			c.bad(field, "%v is not of ipFamilies[%d] %s", ip, i, spec.IPFamilies[i])
			continue
		}
		if used[ip] {
			c.bad(field, "duplicate address %v", ip)
			continue
		}
		used[ip] = true
		s.ClusterIPs = append(s.ClusterIPs, ip)
	}
	for i, str := range spec.ExternalIPs {
		field := fmt.Sprintf("spec.externalIPs[%d]", i)
		if ip, ok := c.addr(field, str); ok {
			if used[ip] {
				c.bad(field, "duplicate address %v", ip)
				continue
			}
			used[ip] = true
			s.ExternalIPs = append(s.ExternalIPs, ip)
		}
	}
	// LoadBalancer ingress IPs are served only in ipMode VIP (the default):
	// with Proxy the load balancer delivers to the node or pod itself.
	for i, ing := range c.svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode != v1.LoadBalancerIPModeVIP) {
			continue
		}
		// An ingress IP repeated is one (clouds repeat them); one that is
		// also a ClusterIP or an externalIP stays a LoadBalancer IP, so
		// loadBalancerSourceRanges restrict it as kube-proxy does, and is
		// served once, as that (lb.Service.frontends).
		if ip, ok := c.addr(fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i), ing.IP); ok && !slices.Contains(s.LoadBalancerIPs, ip) {
			s.LoadBalancerIPs = append(s.LoadBalancerIPs, ip)
		}
	}

	// loadBalancerSourceRanges, parsed as kube-proxy parses them: the API
	// server's validation lets padding and (in objects from before 1.33)
	// leading zeros through; an empty one is skipped, one that still does
	// not parse is left out (the others still restrict the Service).
	for i, str := range spec.LoadBalancerSourceRanges {
		str = strings.TrimSpace(str)
		if str == "" {
			continue
		}
		_, n, err := netutils.ParseCIDRSloppy(str)
		p, ok := netip.Prefix{}, false
		if err == nil {
			a, _ := netip.AddrFromSlice(n.IP)
			ones, _ := n.Mask.Size()
			p = netip.PrefixFrom(a, ones)
			ok = p.IsValid()
		}
		if !ok {
			c.bad(fmt.Sprintf("spec.loadBalancerSourceRanges[%d]", i), "%q is not a CIDR; ignored", str)
			continue
		}
		s.LoadBalancerSourceRanges = append(s.LoadBalancerSourceRanges, lb.SourceRange(p))
	}

	if spec.SessionAffinity == v1.ServiceAffinityClientIP {
		s.AffinityTimeout = lb.DefaultAffinityTimeout
		if cfg := spec.SessionAffinityConfig; cfg != nil && cfg.ClientIP != nil && cfg.ClientIP.TimeoutSeconds != nil {
			if t := *cfg.ClientIP.TimeoutSeconds; t < 1 || t > MaxAffinitySeconds {
				c.bad("spec.sessionAffinityConfig.clientIP.timeoutSeconds", "%d is not in 1-%d; using %v", t, MaxAffinitySeconds, lb.DefaultAffinityTimeout)
			} else {
				s.AffinityTimeout = time.Duration(t) * time.Second
			}
		}
	}
	if v, ok := c.svc.Annotations[AnnotationFirstByteTimeout]; ok {
		field := "metadata.annotations[" + AnnotationFirstByteTimeout + "]"
		if d, err := time.ParseDuration(strings.TrimSpace(v)); err != nil || d <= 0 {
			c.bad(field, "%q is not a positive duration (e.g. 2s); ignored", v)
		} else {
			s.FirstByteTimeout = d
		}
	}
	if spec.InternalTrafficPolicy != nil && *spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal {
		s.InternalTrafficPolicy = lb.PolicyLocal
	}
	if externallyAccessible(c.svc) && spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal {
		s.ExternalTrafficPolicy = lb.PolicyLocal
	}
	s.HealthCheckNodePort = HealthCheckNodePort(c.svc)
	return s
}

// addr parses a Service address; a bad one is reported and dropped.
func (c *converter) addr(field, s string) (netip.Addr, bool) {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		c.bad(field, "invalid IP address %q", s)
		return netip.Addr{}, false
	}
	ip = ip.Unmap()
	if ip.Zone() != "" || ip.IsUnspecified() || ip.IsMulticast() {
		c.bad(field, "%v cannot be a Service address", ip)
		return netip.Addr{}, false
	}
	return ip, true
}

// externallyAccessible is kube-proxy's test for externalTrafficPolicy to
// apply: NodePort and LoadBalancer Services, and ClusterIP ones with
// externalIPs.
func externallyAccessible(svc *v1.Service) bool {
	switch svc.Spec.Type {
	case v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer:
		return true
	case v1.ServiceTypeClusterIP, "":
		return len(svc.Spec.ExternalIPs) > 0
	}
	return false
}

func familyMatches(f v1.IPFamily, ip netip.Addr) bool {
	switch f {
	case v1.IPv4Protocol:
		return ip.Is4()
	case v1.IPv6Protocol:
		return ip.Is6()
	}
	return true
}

type portKey struct {
	name  string
	proto lb.Protocol
}

// endpoints gathers the endpoints of svc's slices by slice port.
func (c *converter) endpoints(all []*discovery.EndpointSlice, nodeName string) map[portKey][]lb.Endpoint {
	var mine []*discovery.EndpointSlice
	for _, es := range all {
		if es != nil && es.Namespace == c.svc.Namespace && es.Labels[discovery.LabelServiceName] == c.svc.Name {
			mine = append(mine, es)
		}
	}
	// Deterministic: the same slices give the same endpoints in any order.
	slices.SortFunc(mine, func(a, b *discovery.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })

	type entry struct {
		ep    lb.Endpoint
		local bool
	}
	byPort := map[portKey][]entry{}
	index := map[portKey]map[netip.AddrPort]int{}
	for _, es := range mine {
		var family func(netip.Addr) bool
		switch es.AddressType {
		case discovery.AddressTypeIPv4:
			family = netip.Addr.Is4
		case discovery.AddressTypeIPv6:
			family = netip.Addr.Is6
		default: // FQDN: not proxied, as kube-proxy
			continue
		}
		if len(es.Endpoints) > MaxEndpointsPerSlice {
			c.badSlice(es, "endpoints", "%d endpoints, more than the API's limit of %d; slice ignored", len(es.Endpoints), MaxEndpointsPerSlice)
			continue
		}
		ports := c.slicePorts(es)
		if len(ports) == 0 {
			continue
		}
		eps := make([]entry, 0, len(es.Endpoints))
		for i := range es.Endpoints {
			e := &es.Endpoints[i]
			field := fmt.Sprintf("endpoints[%d]", i)
			if len(e.Addresses) == 0 {
				c.badSlice(es, field+".addresses", "no address; endpoint ignored")
				continue
			}
			ip, err := netip.ParseAddr(e.Addresses[0])
			if err != nil {
				c.badSlice(es, field+".addresses[0]", "invalid IP address %q; endpoint ignored", e.Addresses[0])
				continue
			}
			if ip.Is4In6() {
				ip = ip.Unmap()
			}
			if !family(ip) {
				c.badSlice(es, field+".addresses[0]", "%v in a slice of addressType %s; endpoint ignored", ip, es.AddressType)
				continue
			}
			if ip.Zone() != "" || ip.IsUnspecified() || ip.IsMulticast() {
				c.badSlice(es, field+".addresses[0]", "%v cannot be an endpoint; endpoint ignored", ip)
				continue
			}
			ep := lb.Endpoint{
				Addr:        netip.AddrPortFrom(ip, 0),
				Ready:       e.Conditions.Ready == nil || *e.Conditions.Ready,
				Serving:     e.Conditions.Serving == nil || *e.Conditions.Serving,
				Terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating,
			}
			if e.NodeName != nil {
				ep.NodeName = *e.NodeName
			}
			if e.Zone != nil {
				ep.Zone = *e.Zone
			}
			if e.Hints != nil {
				for _, z := range e.Hints.ForZones {
					if z.Name != "" && !slices.Contains(ep.ZoneHints, z.Name) {
						ep.ZoneHints = append(ep.ZoneHints, z.Name)
					}
				}
				for _, n := range e.Hints.ForNodes {
					if n.Name != "" && !slices.Contains(ep.NodeHints, n.Name) {
						ep.NodeHints = append(ep.NodeHints, n.Name)
					}
				}
			}
			eps = append(eps, entry{ep, nodeName != "" && ep.NodeName == nodeName})
		}
		for key, port := range ports {
			if index[key] == nil {
				index[key] = map[netip.AddrPort]int{}
			}
			for _, en := range eps {
				en.ep.Addr = netip.AddrPortFrom(en.ep.Addr.Addr(), port)
				if j, dup := index[key][en.ep.Addr]; dup {
					if en.local && !byPort[key][j].local {
						byPort[key][j] = en
					}
					continue
				}
				index[key][en.ep.Addr] = len(byPort[key])
				byPort[key] = append(byPort[key], en)
			}
		}
	}
	out := make(map[portKey][]lb.Endpoint, len(byPort))
	for key, entries := range byPort {
		eps := make([]lb.Endpoint, len(entries))
		for i, en := range entries {
			eps[i] = en.ep
		}
		slices.SortFunc(eps, func(a, b lb.Endpoint) int { return a.Addr.Compare(b.Addr) })
		out[key] = eps
	}
	return out
}

// slicePorts returns a slice's valid ports by name and protocol.
func (c *converter) slicePorts(es *discovery.EndpointSlice) map[portKey]uint16 {
	ports := make(map[portKey]uint16, len(es.Ports))
	for i, p := range es.Ports {
		field := fmt.Sprintf("ports[%d]", i)
		var key portKey
		if p.Name != nil {
			key.name = *p.Name
		}
		if p.Protocol != nil {
			proto, err := lb.ParseProtocol(string(*p.Protocol))
			if err != nil {
				// Not TCP, UDP or SCTP: no Service port can use it.
				continue
			}
			key.proto = proto
		}
		switch {
		case p.Port == nil || *p.Port == 0:
			c.badSlice(es, field+".port", "missing; port ignored")
		case *p.Port < 1 || *p.Port > 65535:
			c.badSlice(es, field+".port", "%d is not in 1-65535; port ignored", *p.Port)
		default:
			if _, dup := ports[key]; dup {
				c.badSlice(es, field, "duplicate port %v %q; port ignored", key.proto, key.name)
				continue
			}
			ports[key] = uint16(*p.Port)
		}
	}
	return ports
}

// HealthCheckNodePort is the port kube-proxy serves svc's health check on:
// spec.healthCheckNodePort of a LoadBalancer Service with
// externalTrafficPolicy Local; 0 for every other Service.
func HealthCheckNodePort(svc *v1.Service) uint16 {
	if svc.Spec.Type != v1.ServiceTypeLoadBalancer || svc.Spec.ExternalTrafficPolicy != v1.ServiceExternalTrafficPolicyLocal {
		return 0
	}
	if p := svc.Spec.HealthCheckNodePort; p > 0 && p <= 65535 {
		return uint16(p)
	}
	return 0
}

// ProxyMode returns the Node's net.experimental.kubernetes.io/proxy-mode
// annotation, trimmed; "" when unset.
func ProxyMode(node *v1.Node) string {
	if node == nil {
		return ""
	}
	return strings.TrimSpace(node.Annotations[AnnotationProxyMode])
}

// Zone returns the Node's topology.kubernetes.io/zone label; "" when unset.
func Zone(node *v1.Node) string {
	if node == nil {
		return ""
	}
	return node.Labels[v1.LabelTopologyZone]
}
