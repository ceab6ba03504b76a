package kube

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/svcproxy/svcproxy/lb"
)

func ptr[T any](v T) *T { return &v }

// svc builds a ClusterIP Service ns/web on 10.0.0.10 with one port, then
// applies the edits.
func svc(edits ...func(*v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  "10.0.0.10",
			ClusterIPs: []string{"10.0.0.10"},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
			Ports:      []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80}},
		},
	}
	for _, e := range edits {
		e(s)
	}
	return s
}

// ep is an endpoint entry: address, conditions (r: ready, s: serving, t:
// terminating; "" means all unset), node, zone hints.
func ep(addr, conds, node string, hints ...string) discovery.Endpoint {
	e := discovery.Endpoint{Addresses: []string{addr}}
	if conds != "" {
		e.Conditions = discovery.EndpointConditions{
			Ready:       ptr(strings.Contains(conds, "r")),
			Serving:     ptr(strings.Contains(conds, "s")),
			Terminating: ptr(strings.Contains(conds, "t")),
		}
	}
	if node != "" {
		e.NodeName = ptr(node)
		e.Zone = ptr("zone-" + node)
	}
	if len(hints) > 0 {
		e.Hints = &discovery.EndpointHints{}
		for _, h := range hints {
			e.Hints.ForZones = append(e.Hints.ForZones, discovery.ForZone{Name: h})
		}
	}
	return e
}

// forNodes adds node hints (hints.forNodes) to e.
func forNodes(e discovery.Endpoint, nodes ...string) discovery.Endpoint {
	if e.Hints == nil {
		e.Hints = &discovery.EndpointHints{}
	}
	for _, n := range nodes {
		e.Hints.ForNodes = append(e.Hints.ForNodes, discovery.ForNode{Name: n})
	}
	return e
}

type sport struct {
	name  string
	proto v1.Protocol
	port  int32
}

// slice builds an EndpointSlice of ns/web named name.
func slice(name string, at discovery.AddressType, ports []sport, eps ...discovery.Endpoint) *discovery.EndpointSlice {
	es := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{discovery.LabelServiceName: "web"}},
		AddressType: at,
		Endpoints:   eps,
	}
	for _, p := range ports {
		es.Ports = append(es.Ports, discovery.EndpointPort{Name: ptr(p.name), Protocol: ptr(p.proto), Port: ptr(p.port)})
	}
	return es
}

var httpPort = []sport{{"http", v1.ProtocolTCP, 8080}}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

func lbep(addr string, ready, serving, terminating bool, node string, hints ...string) lb.Endpoint {
	e := lb.Endpoint{Addr: netip.MustParseAddrPort(addr), Ready: ready, Serving: serving, Terminating: terminating, NodeName: node}
	if node != "" {
		e.Zone = "zone-" + node
	}
	if len(hints) > 0 {
		e.ZoneHints = hints
	}
	return e
}

func nodeHints(e lb.Endpoint, nodes ...string) lb.Endpoint {
	e.NodeHints = nodes
	return e
}

// base is what svc() converts to with no endpoints.
func base(edits ...func(*lb.Service)) lb.Service {
	s := lb.Service{
		Name:       lb.ServicePortName{Namespace: "ns", Name: "web", Port: "http"},
		Protocol:   lb.TCP,
		Port:       80,
		ClusterIPs: addrs("10.0.0.10"),
	}
	for _, e := range edits {
		e(&s)
	}
	return s
}

func withEndpoints(eps ...lb.Endpoint) func(*lb.Service) {
	return func(s *lb.Service) { s.Endpoints = eps }
}

func TestConvert(t *testing.T) {
	local, cluster := lb.PolicyLocal, lb.PolicyCluster
	_ = cluster
	for _, tc := range []struct {
		name   string
		svc    *v1.Service
		slices []*discovery.EndpointSlice
		proxy  string
		want   []lb.Service
		errs   []string // substrings, one per expected problem, in order
	}{
		{
			name: "ClusterIP with no slices: a Service with no endpoints",
			svc:  svc(),
			want: []lb.Service{base()},
		},
		{
			name: "conditions: nil means ready and serving, not terminating",
			svc:  svc(),
			slices: []*discovery.EndpointSlice{slice("web-1", discovery.AddressTypeIPv4, httpPort,
				ep("10.1.0.1", "", ""),
				ep("10.1.0.2", "rs", "node-a"),
				ep("10.1.0.3", "st", "node-b"),
				ep("10.1.0.4", "t", "node-b"),
				ep("10.1.0.5", "-", ""))},
			want: []lb.Service{base(withEndpoints(
				lbep("10.1.0.1:8080", true, true, false, ""),
				lbep("10.1.0.2:8080", true, true, false, "node-a"),
				lbep("10.1.0.3:8080", false, true, true, "node-b"),
				lbep("10.1.0.4:8080", false, false, true, "node-b"),
				lbep("10.1.0.5:8080", false, false, false, ""),
			))},
		},
		{
			name: "endpoints of several slices merge; duplicates count once, this node's entry wins",
			svc:  svc(),
			slices: []*discovery.EndpointSlice{
				slice("web-b", discovery.AddressTypeIPv4, httpPort, ep("10.1.0.1", "rs", "node-a"), ep("10.1.0.2", "", "")),
				slice("web-a", discovery.AddressTypeIPv4, httpPort, ep("10.1.0.1", "", "other"), ep("10.1.0.3", "", "")),
			},
			want: []lb.Service{base(withEndpoints(
				lbep("10.1.0.1:8080", true, true, false, "node-a"),
				lbep("10.1.0.2:8080", true, true, false, ""),
				lbep("10.1.0.3:8080", true, true, false, ""),
			))},
		},
		{
			name: "slices of other Services and namespaces, FQDN slices and unmatched ports are ignored",
			svc:  svc(),
			slices: []*discovery.EndpointSlice{
				func() *discovery.EndpointSlice {
					es := slice("other", discovery.AddressTypeIPv4, httpPort, ep("10.9.0.1", "", ""))
					es.Labels[discovery.LabelServiceName] = "other"
					return es
				}(),
				func() *discovery.EndpointSlice {
					es := slice("web-x", discovery.AddressTypeIPv4, httpPort, ep("10.9.0.2", "", ""))
					es.Namespace = "elsewhere"
					return es
				}(),
				slice("web-fqdn", discovery.AddressTypeFQDN, httpPort, ep("example.com", "", "")),
				slice("web-udp", discovery.AddressTypeIPv4, []sport{{"http", v1.ProtocolUDP, 8080}}, ep("10.9.0.3", "", "")),
				slice("web-name", discovery.AddressTypeIPv4, []sport{{"https", v1.ProtocolTCP, 8443}}, ep("10.9.0.4", "", "")),
				slice("web-ok", discovery.AddressTypeIPv4, httpPort, ep("10.1.0.1", "", "")),
			},
			want: []lb.Service{base(withEndpoints(lbep("10.1.0.1:8080", true, true, false, "")))},
		},
		{
			name: "multi-port: each Service port gets the slice port of its name and protocol",
			svc: svc(func(s *v1.Service) {
				s.Spec.Ports = []v1.ServicePort{
					{Name: "https", Protocol: v1.ProtocolTCP, Port: 443},
					{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53},
					{Name: "http", Protocol: v1.ProtocolTCP, Port: 80},
				}
			}),
			slices: []*discovery.EndpointSlice{slice("web-1", discovery.AddressTypeIPv4,
				[]sport{{"http", v1.ProtocolTCP, 8080}, {"https", v1.ProtocolTCP, 8443}, {"dns", v1.ProtocolUDP, 5353}},
				ep("10.1.0.1", "", ""))},
			want: []lb.Service{
				func() lb.Service {
					s := base(withEndpoints(lbep("10.1.0.1:5353", true, true, false, "")))
					s.Name.Port, s.Protocol, s.Port = "dns", lb.UDP, 53
					return s
				}(),
				base(withEndpoints(lbep("10.1.0.1:8080", true, true, false, ""))),
				func() lb.Service {
					s := base(withEndpoints(lbep("10.1.0.1:8443", true, true, false, "")))
					s.Name.Port, s.Port = "https", 443
					return s
				}(),
			},
		},
		{
			name: "unnamed single port matches a slice port with a nil name",
			svc:  svc(func(s *v1.Service) { s.Spec.Ports[0].Name = "" }),
			slices: []*discovery.EndpointSlice{func() *discovery.EndpointSlice {
				es := slice("web-1", discovery.AddressTypeIPv4, httpPort, ep("10.1.0.1", "", ""))
				es.Ports[0].Name = nil
				return es
			}()},
			want: []lb.Service{base(func(s *lb.Service) {
				s.Name.Port = ""
				s.Endpoints = []lb.Endpoint{lbep("10.1.0.1:8080", true, true, false, "")}
			})},
		},
		{
			name: "dual-stack: both ClusterIPs and endpoints of both families",
			svc: svc(func(s *v1.Service) {
				s.Spec.ClusterIPs = []string{"10.0.0.10", "fd00::10"}
				s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
			}),
			slices: []*discovery.EndpointSlice{
				slice("web-v4", discovery.AddressTypeIPv4, httpPort, ep("10.1.0.1", "", "")),
				slice("web-v6", discovery.AddressTypeIPv6, httpPort, ep("fd00:1::1", "", "")),
			},
			want: []lb.Service{base(func(s *lb.Service) {
				s.ClusterIPs = addrs("10.0.0.10", "fd00::10")
				s.Endpoints = []lb.Endpoint{lbep("10.1.0.1:8080", true, true, false, ""), lbep("[fd00:1::1]:8080", true, true, false, "")}
			})},
		},
		{
			name: "IPv6-only Service",
			svc: svc(func(s *v1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = "fd00::10", []string{"fd00::10"}
				s.Spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol}
			}),
			slices: []*discovery.EndpointSlice{slice("web-v6", discovery.AddressTypeIPv6, httpPort, ep("fd00:1::1", "", ""))},
			want: []lb.Service{base(func(s *lb.Service) {
				s.ClusterIPs = addrs("fd00::10")
				s.Endpoints = []lb.Endpoint{lbep("[fd00:1::1]:8080", true, true, false, "")}
			})},
		},
		{
			name: "ClusterIP only in spec.clusterIP (older objects)",
			svc:  svc(func(s *v1.Service) { s.Spec.ClusterIPs, s.Spec.IPFamilies = nil, nil }),
			want: []lb.Service{base()},
		},
		{
			name: "session affinity ClientIP with its timeout, and the default",
			svc: svc(func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr[int32](60)}}
			}),
			want: []lb.Service{base(func(s *lb.Service) { s.AffinityTimeout = time.Minute })},
		},
		{
			name: "session affinity ClientIP without config: Kubernetes' default",
			svc:  svc(func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityClientIP }),
			want: []lb.Service{base(func(s *lb.Service) { s.AffinityTimeout = lb.DefaultAffinityTimeout })},
		},
		{
			name: "internalTrafficPolicy Local",
			svc: svc(func(s *v1.Service) {
				s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyLocal)
			}),
			want: []lb.Service{base(func(s *lb.Service) { s.InternalTrafficPolicy = local })},
		},
		{
			name: "externalTrafficPolicy Local is ignored on a ClusterIP Service without externalIPs",
			svc: svc(func(s *v1.Service) {
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			}),
			want: []lb.Service{base()},
		},
		{
			name: "NodePort with externalTrafficPolicy Local",
			svc: svc(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports[0].NodePort = 30080
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			}),
			want: []lb.Service{base(func(s *lb.Service) { s.NodePort = 30080; s.ExternalTrafficPolicy = local })},
		},
		{
			name: "nodePort on a ClusterIP Service is not served",
			svc:  svc(func(s *v1.Service) { s.Spec.Ports[0].NodePort = 30080 }),
			want: []lb.Service{base()},
		},
		{
			name: "externalIPs, with externalTrafficPolicy Local",
			svc: svc(func(s *v1.Service) {
				s.Spec.ExternalIPs = []string{"192.0.2.1", "2001:db8::1"}
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			}),
			want: []lb.Service{base(func(s *lb.Service) {
				s.ExternalIPs = addrs("192.0.2.1", "2001:db8::1")
				s.ExternalTrafficPolicy = local
			})},
		},
		{
			name: "LoadBalancer: ingress IPs in VIP mode (or unset) are served, Proxy mode and hostnames are not",
			svc: svc(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.Ports[0].NodePort = 30080
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{
					{IP: "192.0.2.10"},
					{IP: "192.0.2.11", IPMode: ptr(v1.LoadBalancerIPModeVIP)},
					{IP: "192.0.2.12", IPMode: ptr(v1.LoadBalancerIPModeProxy)},
					{Hostname: "lb.example.com"},
				}
			}),
			want: []lb.Service{base(func(s *lb.Service) {
				s.NodePort = 30080
				s.LoadBalancerIPs = addrs("192.0.2.10", "192.0.2.11")
			})},
		},
		{
			name: "loadBalancerSourceRanges: padded ones trimmed, masked, leading zeros and mapped ones taken as kube-proxy takes them; an unparsable one left out, an empty one skipped",
			svc: svc(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.Ports[0].NodePort = 30080
				s.Spec.LoadBalancerSourceRanges = []string{" 10.0.0.0/8", "192.0.2.1/24 ", "2001:db8::/32", "10.0.0.0", "", "010.020.0.0/16", "::ffff:172.16.0.0/108"}
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.10"}}
			}),
			want: []lb.Service{base(func(s *lb.Service) {
				s.NodePort = 30080
				s.LoadBalancerIPs = addrs("192.0.2.10")
				s.LoadBalancerSourceRanges = []netip.Prefix{
					netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/32"),
					netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("172.16.0.0/12"),
				}
			})},
			errs: []string{`spec.loadBalancerSourceRanges[3]: "10.0.0.0" is not a CIDR; ignored`},
		},
		{
			name: "invalid: duplicate nodePorts keep the first; an ingress IP equal to the ClusterIP stays a LoadBalancer IP (served once: lb)",
			svc: svc(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.Ports = []v1.ServicePort{
					{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, NodePort: 30080},
					{Name: "alt", Protocol: v1.ProtocolTCP, Port: 81, NodePort: 30080},
					{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, NodePort: 30080},
				}
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "10.0.0.10"}, {IP: "192.0.2.1"}, {IP: "192.0.2.1"}}
			}),
			want: []lb.Service{
				base(func(s *lb.Service) {
					s.Name.Port, s.Port = "alt", 81
					s.LoadBalancerIPs = addrs("10.0.0.10", "192.0.2.1")
				}),
				base(func(s *lb.Service) {
					s.Name.Port, s.Protocol, s.Port, s.NodePort = "dns", lb.UDP, 53, 30080
					s.LoadBalancerIPs = addrs("10.0.0.10", "192.0.2.1")
				}),
				base(func(s *lb.Service) { s.NodePort = 30080; s.LoadBalancerIPs = addrs("10.0.0.10", "192.0.2.1") }),
			},
			errs: []string{"spec.ports[1].nodePort: duplicate nodePort TCP/30080 (also spec.ports[0])"},
		},
		{
			name: "topology hints and zones are carried to the endpoints",
			svc:  svc(func(s *v1.Service) { s.Spec.TrafficDistribution = ptr(v1.ServiceTrafficDistributionPreferClose) }),
			slices: []*discovery.EndpointSlice{slice("web-1", discovery.AddressTypeIPv4, httpPort,
				ep("10.1.0.1", "", "a", "zone-a"), ep("10.1.0.2", "", "b", "zone-b", "zone-c"))},
			want: []lb.Service{base(withEndpoints(
				lbep("10.1.0.1:8080", true, true, false, "a", "zone-a"),
				lbep("10.1.0.2:8080", true, true, false, "b", "zone-b", "zone-c"),
			))},
		},
		{
			name: "node hints (trafficDistribution PreferSameNode) are carried beside zone hints, empty names dropped",
			svc:  svc(func(s *v1.Service) { s.Spec.TrafficDistribution = ptr(v1.ServiceTrafficDistributionPreferSameNode) }),
			slices: []*discovery.EndpointSlice{slice("web-1", discovery.AddressTypeIPv4, httpPort,
				forNodes(ep("10.1.0.1", "", "a", "zone-a"), "a", "", "a"), forNodes(ep("10.1.0.2", "", "b"), "b", "c"))},
			want: []lb.Service{base(withEndpoints(
				nodeHints(lbep("10.1.0.1:8080", true, true, false, "a", "zone-a"), "a"),
				nodeHints(lbep("10.1.0.2:8080", true, true, false, "b"), "b", "c"),
			))},
		},
		{
			name: "headless Service: ignored",
			svc: svc(func(s *v1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = v1.ClusterIPNone, []string{v1.ClusterIPNone}
			}),
		},
		{
			name: "ExternalName Service: ignored",
			svc:  svc(func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName; s.Spec.ExternalName = "example.com" }),
		},
		{
			name: "labelled for another proxy: ignored",
			svc:  svc(func(s *v1.Service) { s.Labels = map[string]string{LabelServiceProxyName: "other"} }),
		},
		{
			name:  "labelled for svcproxy's own proxy name: served",
			svc:   svc(func(s *v1.Service) { s.Labels = map[string]string{LabelServiceProxyName: "svcproxy"} }),
			proxy: "svcproxy",
			want:  []lb.Service{base()},
		},
		{
			name:  "unlabelled while svcproxy has a proxy name: ignored",
			svc:   svc(),
			proxy: "svcproxy",
		},
		{
			name: "SCTP port beside TCP on the same number, each with its slice port",
			svc: svc(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports = []v1.ServicePort{
					{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, NodePort: 30080},
					{Name: "diameter", Protocol: v1.ProtocolSCTP, Port: 80, NodePort: 30080},
				}
			}),
			slices: []*discovery.EndpointSlice{
				slice("a", discovery.AddressTypeIPv4, []sport{{"http", v1.ProtocolTCP, 8080}, {"diameter", v1.ProtocolSCTP, 3868}}, ep("10.1.0.1", "", "")),
			},
			want: []lb.Service{
				base(func(s *lb.Service) {
					s.Name.Port, s.Protocol, s.NodePort = "diameter", lb.SCTP, 30080
					s.Endpoints = []lb.Endpoint{lbep("10.1.0.1:3868", true, true, false, "")}
				}),
				base(func(s *lb.Service) {
					s.NodePort = 30080
					s.Endpoints = []lb.Endpoint{lbep("10.1.0.1:8080", true, true, false, "")}
				}),
			},
		},
		{
			name: "unknown protocol: that port not proxied, the others are",
			svc: svc(func(s *v1.Service) {
				s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "dccp", Protocol: "DCCP", Port: 9})
			}),
			want: []lb.Service{base()},
			errs: []string{"Service ns/web: spec.ports[1].protocol: unsupported protocol"},
		},
		{
			name: "invalid: bad and wrong-family ClusterIPs are dropped; the port keeps the good one",
			svc: svc(func(s *v1.Service) {
				s.Spec.ClusterIPs = []string{"10.0.0.10", "10.0.0.11", "bogus"}
				s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol, v1.IPv4Protocol}
			}),
			want: []lb.Service{base()},
			errs: []string{"spec.clusterIPs[1]: 10.0.0.11 is not of ipFamilies[1] IPv6", `spec.clusterIPs[2]: invalid IP address "bogus"`},
		},
		{
			name: "invalid: no valid frontend left drops the port",
			svc:  svc(func(s *v1.Service) { s.Spec.ClusterIPs = []string{"300.1.1.1"}; s.Spec.ClusterIP = "300.1.1.1" }),
			errs: []string{`spec.clusterIPs[0]: invalid IP address "300.1.1.1"`, "spec.ports[0]: no valid clusterIP"},
		},
		{
			name: "invalid: ports out of range and duplicate ports are dropped, the rest served",
			svc: svc(func(s *v1.Service) {
				s.Spec.Ports = []v1.ServicePort{
					{Name: "http", Protocol: v1.ProtocolTCP, Port: 80},
					{Name: "big", Protocol: v1.ProtocolTCP, Port: 70000},
					{Name: "zero", Protocol: v1.ProtocolTCP, Port: 0},
					{Name: "http", Protocol: v1.ProtocolTCP, Port: 81},
					{Name: "again", Protocol: v1.ProtocolTCP, Port: 80},
				}
			}),
			want: []lb.Service{base()},
			errs: []string{"spec.ports[1].port: 70000 is not in 1-65535", "spec.ports[2].port: 0 is not in 1-65535",
				`spec.ports[3].name: duplicate port name "http"`, "spec.ports[4].port: duplicate port TCP/80"},
		},
		{
			name: "invalid: bad externalIP and load balancer IP dropped",
			svc: svc(func(s *v1.Service) {
				s.Spec.ExternalIPs = []string{"nope", "0.0.0.0", "192.0.2.1"}
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "224.0.0.1"}}
			}),
			want: []lb.Service{base(func(s *lb.Service) { s.ExternalIPs = addrs("192.0.2.1") })},
			errs: []string{`spec.externalIPs[0]: invalid IP address "nope"`, "spec.externalIPs[1]: 0.0.0.0 cannot be a Service address",
				"status.loadBalancer.ingress[0].ip: 224.0.0.1 cannot be a Service address"},
		},
		{
			name: "invalid: affinity timeout out of range falls back to the default",
			svc: svc(func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr[int32](0)}}
			}),
			want: []lb.Service{base(func(s *lb.Service) { s.AffinityTimeout = lb.DefaultAffinityTimeout })},
			errs: []string{"timeoutSeconds: 0 is not in 1-86400"},
		},
		{
			name: "first-byte timeout annotation",
			svc: svc(func(s *v1.Service) {
				s.Annotations = map[string]string{AnnotationFirstByteTimeout: " 1500ms "}
			}),
			want: []lb.Service{base(func(s *lb.Service) { s.FirstByteTimeout = 1500 * time.Millisecond })},
		},
		{
			name: "invalid: a first-byte timeout that is no positive duration is ignored",
			svc: svc(func(s *v1.Service) {
				s.Annotations = map[string]string{AnnotationFirstByteTimeout: "-1s"}
			}),
			want: []lb.Service{base()},
			errs: []string{`metadata.annotations[svcproxy.io/first-byte-timeout]: "-1s" is not a positive duration`},
		},
		{
			name: "invalid endpoints: bad IPs, IPv6 in an IPv4 slice, no address: each dropped alone",
			svc:  svc(),
			slices: []*discovery.EndpointSlice{slice("web-1", discovery.AddressTypeIPv4, httpPort,
				ep("10.1.0.1", "", ""),
				ep("10.1.0.999", "", ""),
				ep("fd00::1", "", ""),
				discovery.Endpoint{},
				ep("0.0.0.0", "", ""),
			)},
			want: []lb.Service{base(withEndpoints(lbep("10.1.0.1:8080", true, true, false, "")))},
			errs: []string{`EndpointSlice ns/web-1: endpoints[1].addresses[0]: invalid IP address "10.1.0.999"`,
				"endpoints[2].addresses[0]: fd00::1 in a slice of addressType IPv4",
				"endpoints[3].addresses: no address", "endpoints[4].addresses[0]: 0.0.0.0 cannot be an endpoint"},
		},
		{
			name: "invalid slice ports: missing, out of range and duplicate are dropped",
			svc:  svc(),
			slices: []*discovery.EndpointSlice{
				func() *discovery.EndpointSlice {
					es := slice("web-1", discovery.AddressTypeIPv4, []sport{{"http", v1.ProtocolTCP, 70000}, {"http", v1.ProtocolTCP, 8080}, {"http", v1.ProtocolTCP, 8081}}, ep("10.1.0.1", "", ""))
					es.Ports = append(es.Ports, discovery.EndpointPort{Name: ptr("x")})
					return es
				}(),
			},
			want: []lb.Service{base(withEndpoints(lbep("10.1.0.1:8080", true, true, false, "")))},
			errs: []string{"ports[0].port: 70000 is not in 1-65535", `ports[2]: duplicate port TCP "http"`, "ports[3].port: missing"},
		},
		{
			name: "invalid: a slice beyond the API's 1,000 endpoints is ignored whole; other slices still serve",
			svc:  svc(),
			slices: func() []*discovery.EndpointSlice {
				big := slice("web-big", discovery.AddressTypeIPv4, httpPort)
				for i := 0; i < 10000; i++ {
					big.Endpoints = append(big.Endpoints, ep(fmt.Sprintf("10.2.%d.%d", i/250, i%250+1), "", ""))
				}
				return []*discovery.EndpointSlice{big, slice("web-ok", discovery.AddressTypeIPv4, httpPort, ep("10.1.0.1", "", ""))}
			}(),
			want: []lb.Service{base(withEndpoints(lbep("10.1.0.1:8080", true, true, false, "")))},
			errs: []string{"EndpointSlice ns/web-big: endpoints: 10000 endpoints, more than the API's limit of 1000"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, errs := Convert(tc.svc, tc.slices, tc.proxy, "node-a")
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("services:\n got %+v\nwant %+v", got, tc.want)
			}
			for i := range got {
				if err := got[i].Validate(); err != nil {
					t.Errorf("output %d fails Validate: %v", i, err)
				}
			}
			if len(errs) != len(tc.errs) {
				t.Fatalf("got %d problems, want %d:\n%v", len(errs), len(tc.errs), errors.Join(errs...))
			}
			for i, err := range errs {
				var inv *InvalidError
				if !errors.As(err, &inv) {
					t.Errorf("problem %d is %T, want *InvalidError", i, err)
				}
				if !strings.Contains(err.Error(), tc.errs[i]) {
					t.Errorf("problem %d:\n got %v\nwant it to contain %q", i, err, tc.errs[i])
				}
			}
		})
	}
}

func TestSkipped(t *testing.T) {
	for _, tc := range []struct {
		name  string
		svc   *v1.Service
		proxy string
		want  string
	}{
		{"plain", svc(), "", ""},
		{"headless", svc(func(s *v1.Service) { s.Spec.ClusterIP = v1.ClusterIPNone }), "", "headless"},
		{"no ClusterIP", svc(func(s *v1.Service) { s.Spec.ClusterIP = "" }), "", "headless"},
		{"ExternalName", svc(func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName }), "", "type ExternalName"},
		{"other proxy", svc(func(s *v1.Service) { s.Labels = map[string]string{LabelServiceProxyName: "x"} }), "", `labelled service.kubernetes.io/service-proxy-name="x"`},
		{"empty proxy label", svc(func(s *v1.Service) { s.Labels = map[string]string{LabelServiceProxyName: ""} }), "", `labelled`},
		{"ours", svc(func(s *v1.Service) { s.Labels = map[string]string{LabelServiceProxyName: "svcproxy"} }), "svcproxy", ""},
		{"not ours", svc(), "svcproxy", "not labelled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Skipped(tc.svc, tc.proxy)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("Skipped = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestHealthCheckNodePort: only a LoadBalancer Service with
// externalTrafficPolicy Local has one, and Convert carries it on each of
// its ports (the local endpoint count is healthcheck's, from the applied
// snapshot: see healthcheck.TestFromSnapshot).
func TestHealthCheckNodePort(t *testing.T) {
	lbLocal := svc(func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = 32000
		s.Spec.Ports = []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, NodePort: 30080}, {Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, NodePort: 30053}}
	})
	if got := HealthCheckNodePort(lbLocal); got != 32000 {
		t.Errorf("LoadBalancer, Local: port %d, want 32000", got)
	}
	ports, errs := Convert(lbLocal, nil, "", "node-a")
	if len(errs) > 0 || len(ports) != 2 {
		t.Fatalf("Convert: %d ports, problems %v; want 2, none", len(ports), errs)
	}
	for _, p := range ports {
		if p.HealthCheckNodePort != 32000 {
			t.Errorf("port %v: HealthCheckNodePort %d, want 32000", p.Name, p.HealthCheckNodePort)
		}
	}
	for name, s := range map[string]*v1.Service{
		"NodePort, Local": svc(func(s *v1.Service) { *s = *lbLocal.DeepCopy(); s.Spec.Type = v1.ServiceTypeNodePort }),
		"LoadBalancer, Cluster": svc(func(s *v1.Service) {
			*s = *lbLocal.DeepCopy()
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
		}),
	} {
		if got := HealthCheckNodePort(s); got != 0 {
			t.Errorf("%s: port %d, want 0", name, got)
		}
		ports, _ := Convert(s, nil, "", "node-a")
		for _, p := range ports {
			if p.HealthCheckNodePort != 0 {
				t.Errorf("%s: port %v: HealthCheckNodePort %d, want 0", name, p.Name, p.HealthCheckNodePort)
			}
		}
	}
}

func TestNodeAccessors(t *testing.T) {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{
		Labels:      map[string]string{v1.LabelTopologyZone: "zone-a"},
		Annotations: map[string]string{AnnotationProxyMode: " ipvs "},
	}}
	if got := ProxyMode(n); got != "ipvs" {
		t.Errorf("ProxyMode = %q, want ipvs", got)
	}
	if got := Zone(n); got != "zone-a" {
		t.Errorf("Zone = %q, want zone-a", got)
	}
	if ProxyMode(nil) != "" || Zone(nil) != "" || ProxyMode(&v1.Node{}) != "" {
		t.Error("a nil or bare Node must give empty values")
	}
}

// TestConvertWithPolicy: the converted endpoints, through lb's one policy,
// give kube-proxy's answers for a rolling update and Local policies.
func TestConvertWithPolicy(t *testing.T) {
	s := svc(func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	})
	es := slice("web-1", discovery.AddressTypeIPv4, httpPort,
		ep("10.1.0.1", "st", "node-a"), // terminating, still serving, local
		ep("10.1.0.2", "rs", "node-b"), // ready, remote
		ep("10.1.0.3", "t", "node-a"),  // terminating, not serving
	)
	ports, errs := Convert(s, []*discovery.EndpointSlice{es}, "", "node-a")
	if len(errs) > 0 || len(ports) != 1 {
		t.Fatalf("Convert: %v %v", ports, errs)
	}
	internal, external, _ := lb.UsableEndpoints(&ports[0], lb.Node{Name: "node-a"})
	addrsOf := func(eps []lb.Endpoint) (out []string) {
		for _, e := range eps {
			out = append(out, e.Addr.String())
		}
		return out
	}
	if got := addrsOf(internal); !reflect.DeepEqual(got, []string{"10.1.0.2:8080"}) {
		t.Errorf("internal (Cluster) = %v, want the ready remote endpoint only", got)
	}
	if got := addrsOf(external); !reflect.DeepEqual(got, []string{"10.1.0.1:8080"}) {
		t.Errorf("external (Local) = %v, want the local serving-terminating endpoint", got)
	}
}
