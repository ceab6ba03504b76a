package file

import (
	"errors"
	"io/fs"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/examples"
	"github.com/svcproxy/svcproxy/lb"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []lb.Service
	}{{
		name: "defaults",
		yaml: `
services:
  - name: web
    clusterIP: 10.0.0.1
    ports:
      - port: 80
    endpoints:
      - ip: 10.1.0.1
`,
		want: []lb.Service{{
			Name:       lb.ServicePortName{Namespace: "default", Name: "web"},
			Protocol:   lb.TCP,
			Port:       80,
			ClusterIPs: []netip.Addr{addr("10.0.0.1")},
			Endpoints:  []lb.Endpoint{{Addr: addrPort("10.1.0.1:80"), Ready: true, Serving: true}},
		}},
	}, {
		name: "every field",
		yaml: `
services:
  - name: web
    namespace: shop
    clusterIPs: [10.0.0.1, "fd00::1"]
    externalIPs: [192.0.2.1]
    loadBalancerIPs: [198.51.100.1]
    loadBalancerSourceRanges: [10.0.0.1/8, " fd00::/64"]
    sessionAffinity: ClientIP
    sessionAffinityTimeoutSeconds: 60
    internalTrafficPolicy: Local
    externalTrafficPolicy: Local
    healthCheckNodePort: 32000
    algorithm: least-conn
    firstByteTimeout: 1500ms
    ports:
      - name: http
        protocol: TCP
        port: 80
        targetPort: 8080
        nodePort: 30080
      - name: dns
        protocol: udp
        port: 53
    endpoints:
      - ip: 10.1.0.1
        ready: false
        serving: true
        terminating: true
        nodeName: node-a
        zone: zone-a
        zoneHints: [zone-a, zone-b]
        nodeHints: [node-a]
      - ip: 10.1.0.2
        ready: false
        ports: {http: 9090}
`,
		want: func() []lb.Service {
			base := lb.Service{
				ClusterIPs:      []netip.Addr{addr("10.0.0.1"), addr("fd00::1")},
				ExternalIPs:     []netip.Addr{addr("192.0.2.1")},
				LoadBalancerIPs: []netip.Addr{addr("198.51.100.1")},
				LoadBalancerSourceRanges: []netip.Prefix{
					netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/64"),
				},
				AffinityTimeout:       time.Minute,
				InternalTrafficPolicy: lb.PolicyLocal,
				ExternalTrafficPolicy: lb.PolicyLocal,
				HealthCheckNodePort:   32000,
				Algorithm:             lb.LeastConn,
				FirstByteTimeout:      1500 * time.Millisecond,
			}
			ep1 := lb.Endpoint{Serving: true, Terminating: true, NodeName: "node-a", Zone: "zone-a", ZoneHints: []string{"zone-a", "zone-b"}, NodeHints: []string{"node-a"}}
			ep2 := lb.Endpoint{}
			http, dns := base, base
			http.Name = lb.ServicePortName{Namespace: "shop", Name: "web", Port: "http"}
			http.Protocol, http.Port, http.NodePort = lb.TCP, 80, 30080
			ep1.Addr, ep2.Addr = addrPort("10.1.0.1:8080"), addrPort("10.1.0.2:9090")
			http.Endpoints = []lb.Endpoint{ep1, ep2}
			dns.Name = lb.ServicePortName{Namespace: "shop", Name: "web", Port: "dns"}
			dns.Protocol, dns.Port = lb.UDP, 53
			ep1.Addr, ep2.Addr = addrPort("10.1.0.1:53"), addrPort("10.1.0.2:53")
			dns.Endpoints = []lb.Endpoint{ep1, ep2}
			return []lb.Service{http, dns}
		}(),
	}, {
		name: "SCTP beside TCP on the same port and nodePort",
		yaml: `
services:
  - name: diameter
    clusterIP: 10.0.0.3
    ports:
      - {name: tcp, port: 3868, nodePort: 30868}
      - {name: sctp, protocol: SCTP, port: 3868, nodePort: 30868, targetPort: 3869}
    endpoints:
      - ip: 10.1.0.3
`,
		want: []lb.Service{{
			Name:       lb.ServicePortName{Namespace: "default", Name: "diameter", Port: "tcp"},
			Protocol:   lb.TCP,
			Port:       3868,
			NodePort:   30868,
			ClusterIPs: []netip.Addr{addr("10.0.0.3")},
			Endpoints:  []lb.Endpoint{{Addr: addrPort("10.1.0.3:3868"), Ready: true, Serving: true}},
		}, {
			Name:       lb.ServicePortName{Namespace: "default", Name: "diameter", Port: "sctp"},
			Protocol:   lb.SCTP,
			Port:       3868,
			NodePort:   30868,
			ClusterIPs: []netip.Addr{addr("10.0.0.3")},
			Endpoints:  []lb.Endpoint{{Addr: addrPort("10.1.0.3:3869"), Ready: true, Serving: true}},
		}},
	}, {
		name: "affinity default timeout, nodePort only, no endpoints",
		yaml: `
services:
  - name: sticky
    sessionAffinity: ClientIP
    ports:
      - port: 80
        nodePort: 30080
`,
		want: []lb.Service{{
			Name:            lb.ServicePortName{Namespace: "default", Name: "sticky"},
			Port:            80,
			NodePort:        30080,
			AffinityTimeout: lb.DefaultAffinityTimeout,
		}},
	}, {
		name: "same IP on different ports, IPv4-mapped unmapped",
		yaml: `
services:
  - name: web
    clusterIPs: ["::ffff:127.0.0.1"]
    ports:
      - port: 18080
        targetPort: 18081
    endpoints:
      - ip: 127.0.0.1
      - ip: 127.0.0.1
        ports: {"": 18082}
`,
		want: []lb.Service{{
			Name:       lb.ServicePortName{Namespace: "default", Name: "web"},
			Port:       18080,
			ClusterIPs: []netip.Addr{addr("127.0.0.1")},
			Endpoints: []lb.Endpoint{
				{Addr: addrPort("127.0.0.1:18081"), Ready: true, Serving: true},
				{Addr: addrPort("127.0.0.1:18082"), Ready: true, Serving: true},
			},
		}},
	}, {
		name: "empty values mean not set",
		yaml: `
services:
  - name: web
    namespace:
    clusterIP: 10.0.0.1
    externalIPs:
    algorithm: ~
    ports:
      - port: 80
        targetPort:
    endpoints:
`,
		want: []lb.Service{{
			Name:       lb.ServicePortName{Namespace: "default", Name: "web"},
			Port:       80,
			ClusterIPs: []netip.Addr{addr("10.0.0.1")},
		}},
	}, {
		name: "no services, said explicitly",
		yaml: "services: []\n",
	}, {
		name: "no services, in flow style with a comment",
		yaml: "# none yet\n{services: []}\n",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(strings.TrimPrefix(tt.yaml, "\n")))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Parse:\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// TestParseErrors checks that every class of problem is reported with its
// line and field path, and that the service it is in is skipped.
func TestParseErrors(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string // starts at line 1
		wantErr string // a substring of the error
		invalid bool   // the whole file is unusable (ErrInvalidFile)
		want    int    // Services still returned
	}{
		{"unknown key", `services:
  - name: web
    clusterIp: 10.0.0.1
    ports: [{port: 80}]
`, "line 3: services[0].clusterIp: unknown key (did you mean clusterIP?)", false, 0},
		{"unknown port key", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports:
      - port: 80
        tragetPort: 8080
`, "line 6: services[0].ports[0].tragetPort: unknown key", false, 0},
		{"unknown endpoint key", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports: [{port: 80}]
    endpoints:
      - ip: 10.1.0.1
        weight: 2
`, "line 7: services[0].endpoints[0].weight: unknown key", false, 0},
		{"bad firstByteTimeout", `services:
  - name: web
    clusterIP: 10.0.0.1
    firstByteTimeout: 2 seconds
    ports: [{port: 80}]
`, "line 4: services[0].firstByteTimeout: not a duration (e.g. 2s): \"2 seconds\"", false, 0},
		{"zero firstByteTimeout", `services:
  - name: web
    clusterIP: 10.0.0.1
    firstByteTimeout: 0s
    ports: [{port: 80}]
`, "line 4: services[0].firstByteTimeout: must be positive, got 0s", false, 0},
		{"unknown top-level key", `service:
  - name: web
`, "line 1: service: unknown key", true, 0},
		{"duplicate key", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports: [{port: 80}]
    name: web2
`, "line 5: services[0].name: duplicate key (first at line 2)", false, 0},
		{"bad cluster IP", `services:
  - name: web
    clusterIPs: [10.0.0.1, 10.0.0.300]
    ports: [{port: 80}]
`, `line 3: services[0].clusterIPs[1]: invalid IP address "10.0.0.300"`, false, 0},
		{"unspecified IP", `services:
  - name: web
    externalIPs:
      - 0.0.0.0
    ports: [{port: 80}]
`, "line 4: services[0].externalIPs[0]: 0.0.0.0 is unspecified or multicast", false, 0},
		{"bad endpoint IP", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports: [{port: 80}]
    endpoints:
      - ip: 10.1.0.1
      - ip: web-1
`, `line 7: services[0].endpoints[1].ip: invalid IP address "web-1"`, false, 0},
		{"duplicate address", `services:
  - name: web
    clusterIP: 10.0.0.1
    externalIPs: [10.0.0.1]
    ports: [{port: 80}]
`, "line 4: services[0].externalIPs[0]: duplicate address 10.0.0.1 (first at line 3)", false, 0},
		{"clusterIP and clusterIPs", `services:
  - name: web
    clusterIP: 10.0.0.1
    clusterIPs: [10.0.0.2]
    ports: [{port: 80}]
`, "line 3: services[0].clusterIP: set clusterIP or clusterIPs, not both", false, 0},
		{"list expected", `services:
  - name: web
    clusterIPs: 10.0.0.1
    ports: [{port: 80}]
`, `line 3: services[0].clusterIPs: must be a list, got string "10.0.0.1"`, false, 0},
		{"port out of range", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports:
      - port: 65536
`, "line 5: services[0].ports[0].port: must be in 1-65535", false, 0},
		{"port zero", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports:
      - port: 0
`, "line 5: services[0].ports[0].port: must be in 1-65535", false, 0},
		{"string port", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports:
      - port: 80
        targetPort: http
`, `line 6: services[0].ports[0].targetPort: must be an integer, got string "http"`, false, 0},
		{"bad nodePort", `services:
  - name: web
    ports:
      - port: 80
        nodePort: -1
`, "line 5: services[0].ports[0].nodePort: must be in 1-65535", false, 0},
		{"bad endpoint port override", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports: [{port: 80}]
    endpoints:
      - ip: 10.1.0.1
        ports: {"": 100000}
`, `line 7: services[0].endpoints[0].ports[""]: must be in 1-65535`, false, 0},
		{"override of unknown port", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports: [{name: http, port: 80}]
    endpoints:
      - ip: 10.1.0.1
        ports: {https: 8443}
`, `line 7: services[0].endpoints[0].ports.https: the service has no port named "https"`, false, 0},
		{"missing name", `services:
  - namespace: demo
    clusterIP: 10.0.0.1
    ports: [{port: 80}]
`, "line 2: services[0].name: required", false, 0},
		{"invalid name", `services:
  - name: Web_1
    clusterIP: 10.0.0.1
    ports: [{port: 80}]
`, `line 2: services[0].name: "Web_1" is not a valid name`, false, 0},
		{"non-string name", `services:
  - name: [web]
    clusterIP: 10.0.0.1
    ports: [{port: 80}]
`, "line 2: services[0].name: must be a single value, got a list", false, 0},
		{"missing port", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports:
      - targetPort: 80
`, "line 5: services[0].ports[0].port: required", false, 0},
		{"missing ports", `services:
  - name: web
    clusterIP: 10.0.0.1
`, "line 2: services[0].ports: required", false, 0},
		{"empty ports", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports: []
`, "line 4: services[0].ports: must list at least one port", false, 0},
		{"bad source range", `services:
  - name: web
    loadBalancerIPs: [198.51.100.1]
    loadBalancerSourceRanges: [10.0.0.0/8, 10.0.0.0]
    ports: [{port: 80}]
`, `line 4: services[0].loadBalancerSourceRanges[1]: "10.0.0.0" is not a CIDR (e.g. 10.0.0.0/8)`, false, 0},
		{"no frontend", `services:
  - name: web
    ports: [{port: 80}]
`, "line 2: services[0]: a service needs at least one of clusterIPs, externalIPs, loadBalancerIPs or a nodePort", false, 0},
		{"duplicate service", `services:
  - name: web
    namespace: default
    clusterIP: 10.0.0.1
    ports: [{port: 80}]
  - name: web
    clusterIP: 10.0.0.2
    ports: [{port: 80}]
`, "line 6: services[1].name: duplicate service default/web (first at line 2)", false, 1},
		{"unnamed multi-port", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports:
      - name: http
        port: 80
      - port: 443
`, "line 7: services[0].ports[1].name: required when a service has more than one port", false, 0},
		{"duplicate port name", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports:
      - name: http
        port: 80
      - name: http
        port: 8080
`, `line 7: services[0].ports[1].name: duplicate port name "http" (first at line 5)`, false, 0},
		{"duplicate port", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports:
      - {name: a, port: 80}
      - {name: b, port: 80, protocol: UDP}
      - {name: c, port: 80}
`, "line 7: services[0].ports[2].port: duplicate port TCP/80 (first at line 5)", false, 0},
		{"bad protocol", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports:
      - port: 80
        protocol: DCCP
`, `line 6: services[0].ports[0].protocol: unsupported protocol "DCCP" (want TCP, UDP or SCTP)`, false, 0},
		{"empty node hint", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports: [{port: 80}]
    endpoints:
      - {ip: 10.1.0.1, nodeHints: [node-a, ""]}
`, `line 6: services[0].endpoints[0].nodeHints[1]: must not be empty`, false, 0},
		{"node hints not a list", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports: [{port: 80}]
    endpoints:
      - {ip: 10.1.0.1, nodeHints: node-a}
`, `line 6: services[0].endpoints[0].nodeHints:`, false, 0},
		{"bad affinity", `services:
  - name: web
    clusterIP: 10.0.0.1
    sessionAffinity: Sticky
    ports: [{port: 80}]
`, `line 4: services[0].sessionAffinity: unknown affinity "Sticky" (want None or ClientIP)`, false, 0},
		{"affinity timeout without affinity", `services:
  - name: web
    clusterIP: 10.0.0.1
    sessionAffinityTimeoutSeconds: 60
    ports: [{port: 80}]
`, "line 4: services[0].sessionAffinityTimeoutSeconds: only valid with sessionAffinity: ClientIP", false, 0},
		{"affinity timeout too long", `services:
  - name: web
    clusterIP: 10.0.0.1
    sessionAffinity: ClientIP
    sessionAffinityTimeoutSeconds: 86401
    ports: [{port: 80}]
`, "line 5: services[0].sessionAffinityTimeoutSeconds: must be in 1-86400", false, 0},
		{"bad traffic policy", `services:
  - name: web
    clusterIP: 10.0.0.1
    externalTrafficPolicy: Global
    ports: [{port: 80}]
`, `line 4: services[0].externalTrafficPolicy: unknown traffic policy "Global"`, false, 0},
		{"health check without Local", `services:
  - name: web
    loadBalancerIPs: [198.51.100.1]
    healthCheckNodePort: 32000
    ports: [{port: 80}]
`, "line 4: services[0].healthCheckNodePort: only valid with externalTrafficPolicy: Local and loadBalancerIPs", false, 0},
		{"health check without loadBalancerIPs", `services:
  - name: web
    clusterIP: 10.0.0.1
    externalTrafficPolicy: Local
    healthCheckNodePort: 32000
    ports: [{port: 80}]
`, "line 5: services[0].healthCheckNodePort: only valid with externalTrafficPolicy: Local and loadBalancerIPs", false, 0},
		{"health check port out of range", `services:
  - name: web
    loadBalancerIPs: [198.51.100.1]
    externalTrafficPolicy: Local
    healthCheckNodePort: 70000
    ports: [{port: 80}]
`, "line 5: services[0].healthCheckNodePort: must be in 1-65535", false, 0},
		{"health check on its own nodePort", `services:
  - name: web
    loadBalancerIPs: [198.51.100.1]
    externalTrafficPolicy: Local
    healthCheckNodePort: 30080
    ports: [{port: 80, nodePort: 30080}]
`, "line 5: services[0].healthCheckNodePort: 30080 is also a TCP nodePort of this service", false, 0},
		{"health check on another service's nodePort", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports: [{port: 80, nodePort: 30080}]
  - name: lb
    loadBalancerIPs: [198.51.100.1]
    externalTrafficPolicy: Local
    healthCheckNodePort: 30080
    ports: [{port: 80}]
`, "services[1].healthCheckNodePort: TCP port 30080 already belongs to default/web", false, 1},
		{"bad algorithm", `services:
  - name: web
    clusterIP: 10.0.0.1
    algorithm: fastest
    ports: [{port: 80}]
`, `line 4: services[0].algorithm: unknown algorithm "fastest"`, false, 0},
		{"bad bool", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports: [{port: 80}]
    endpoints:
      - ip: 10.1.0.1
        ready: yes
`, `line 7: services[0].endpoints[0].ready: must be true or false, got string "yes"`, false, 0},
		{"duplicate endpoint", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports: [{port: 80}]
    endpoints:
      - ip: 10.1.0.1
      - ip: 10.1.0.1
`, "line 7: services[0].endpoints[1]: duplicate endpoint 10.1.0.1:80 (first at line 6)", false, 0},
		{"alias", `services:
  - name: web
    clusterIPs: &ips [10.0.0.1]
    externalIPs: *ips
    ports: [{port: 80}]
`, "line 4: services[0].externalIPs: YAML aliases are not supported", false, 0},
		{"service not a mapping", `services:
  - web
`, `line 2: services[0]: must be a mapping, got string "web"`, false, 0},
		{"services not a list", `services: web
`, `line 1: services: must be a list, got string "web"`, true, 0},
		{"top level not a mapping", `- name: web
`, "line 1: must be a mapping, got a list", true, 0},
		{"two documents", `services: []
---
services: []
`, "line 2: only one YAML document is allowed", true, 0},
		// An empty or truncated file is never "no Services".
		{"empty file", "", `the file is empty (truncated?): write "services: []" to serve no Services`, true, 0},
		{"only comments", "# nothing yet\n", "the file is empty", true, 0},
		{"empty document", "---\n", "the file is empty", true, 0},
		{"null document", "~\n", "the file is empty", true, 0},
		{"no services key", "{}\n", `line 1: services: required: write "services: []" to serve no Services`, true, 0},
		{"services null", "services:\n", "line 1: services: required", true, 0},
		{"truncated mid-service", "services:\n  - name: web\n    clusterIP: 10.0.0.1\n    po", "invalid services file: line 4: could not find expected ':'", true, 0},
		{"truncated mid-value", "services:\n  - name: web\n    clusterIP: 10.0.0.1\n    ports: [{port: 80}]\n    endpoints:\n      - ip: 10.1.0.1\n      - ip: 10.1.", `line 7: services[0].endpoints[1].ip: invalid IP address "10.1."`, false, 0},
		{"frontend of another service", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports: [{port: 80}]
  - name: web2
    clusterIPs: [10.0.0.2, 10.0.0.1]
    ports: [{name: a, port: 81}, {name: b, port: 80}]
`, "line 5: services[1]: frontend TCP/10.0.0.1:80 already belongs to default/web (line 2)", false, 1},
		{"same address, other protocol", `services:
  - name: web
    clusterIP: 10.0.0.1
    ports: [{port: 80}]
  - name: dns
    externalIPs: [10.0.0.1]
    ports: [{name: a, port: 80, protocol: UDP}, {name: b, port: 80, protocol: TCP}]
`, "line 5: services[1]: frontend TCP/10.0.0.1:80 already belongs to default/web (line 2)", false, 1},
		{"nodePort of another service", `services:
  - name: web
    ports: [{name: http, port: 80, nodePort: 30080}]
  - name: web2
    namespace: other
    ports: [{port: 8080, nodePort: 30080}]
`, "line 4: services[1]: nodePort TCP/30080 already belongs to default/web:http (line 2)", false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Parse error:\n got %v\nwant it to contain %q", err, tt.wantErr)
			}
			if errors.Is(err, ErrInvalidFile) != tt.invalid {
				t.Errorf("errors.Is(err, ErrInvalidFile) = %v, want %v", !tt.invalid, tt.invalid)
			}
			if len(got) != tt.want {
				t.Errorf("Parse returned %d services, want %d: %+v", len(got), tt.want, got)
			}
		})
	}
}

// TestParseOneErrorPerMistake: a field that is only valid with another
// says nothing more when that other field is itself wrong.
func TestParseOneErrorPerMistake(t *testing.T) {
	tests := []struct {
		name, yaml, wantErr string
	}{
		{"health check with an unknown policy", `services:
  - name: web
    loadBalancerIPs: [198.51.100.1]
    externalTrafficPolicy: Loca
    healthCheckNodePort: 32000
    ports: [{port: 80}]
`, `line 4: services[0].externalTrafficPolicy: unknown traffic policy "Loca"`},
		{"health check with a policy that is not a string", `services:
  - name: web
    loadBalancerIPs: [198.51.100.1]
    externalTrafficPolicy: [Local]
    healthCheckNodePort: 32000
    ports: [{port: 80}]
`, "line 4: services[0].externalTrafficPolicy:"},
		{"affinity timeout with an unknown affinity", `services:
  - name: web
    clusterIP: 10.0.0.1
    sessionAffinity: ClientIp4
    sessionAffinityTimeoutSeconds: 60
    ports: [{port: 80}]
`, `line 4: services[0].sessionAffinity: unknown affinity "ClientIp4"`},
		{"affinity timeout with an affinity that is not a string", `services:
  - name: web
    clusterIP: 10.0.0.1
    sessionAffinity: {ClientIP: true}
    sessionAffinityTimeoutSeconds: 60
    ports: [{port: 80}]
`, "line 4: services[0].sessionAffinity:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			if err == nil {
				t.Fatalf("Parse succeeded, want the error %q", tt.wantErr)
			}
			if lines := strings.Split(err.Error(), "\n"); len(lines) != 1 || !strings.Contains(lines[0], tt.wantErr) {
				t.Errorf("Parse error:\n got %q\nwant one error, containing %q", lines, tt.wantErr)
			}
		})
	}
}

func TestParseSkipsOnlyBadServices(t *testing.T) {
	const yaml = `services:
  - name: a
    clusterIP: 10.0.0.1
    ports: [{port: 80}]
  - name: b
    clusterIP: 10.0.0.2
    ports: [{port: 99999}]
  - name: c
    clusterIP: 10.0.0.3
    ports:
      - {name: x, port: 80}
      - {name: y, port: 81}
  - name: d
    clusterIP: nope
    algorithm: nope
    ports: [{port: 80}]
`
	got, err := Parse([]byte(yaml))
	var names []string
	for _, s := range got {
		names = append(names, s.Name.String())
	}
	if want := []string{"default/a", "default/c:x", "default/c:y"}; !reflect.DeepEqual(names, want) {
		t.Errorf("services: got %q, want %q", names, want)
	}
	var lines []string
	forEach(err, func(err error) { lines = append(lines, err.Error()) })
	want := []string{
		"line 7: services[1].ports[0].port: must be in 1-65535",
		`line 14: services[3].clusterIP: invalid IP address "nope"`,
		`line 15: services[3].algorithm: unknown algorithm "nope" (want round-robin, random, least-conn or maglev)`,
	}
	if !reflect.DeepEqual(lines, want) {
		t.Errorf("errors:\n got %q\nwant %q", lines, want)
	}
	if errors.Is(err, ErrInvalidFile) {
		t.Errorf("errors.Is(err, ErrInvalidFile) = true for a file with some good services")
	}
}

func TestParseSyntaxError(t *testing.T) {
	tests := []struct {
		name, yaml, wantErr string
	}{
		{"unclosed flow", "services: [\n", "invalid services file: line 1:"},
		{"bad indentation", "services:\n  - name: web\n     port: 80\n", "invalid services file: line 3:"},
		{"tab indentation", "services:\n\t- name: web\n", "invalid services file: line 2:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.yaml))
			if got != nil {
				t.Errorf("Parse returned services %+v, want nil", got)
			}
			if !errors.Is(err, ErrInvalidFile) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Parse error:\n got %v\nwant ErrInvalidFile containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestExamples(t *testing.T) {
	fromFile, err := Load("../../examples/services.yaml")
	if err != nil {
		t.Fatalf("Load(examples/services.yaml): %v", err)
	}
	embedded, err := Parse(examples.Services)
	if err != nil {
		t.Fatalf("Parse(examples.Services): %v", err)
	}
	if !reflect.DeepEqual(fromFile, embedded) {
		t.Errorf("examples/services.yaml and examples.Services differ:\n%+v\n%+v", fromFile, embedded)
	}
	type summary struct {
		name      string
		frontend  string
		nodePort  uint16
		algorithm lb.Algorithm
		affinity  time.Duration
		endpoints string
	}
	var got []summary
	for _, s := range embedded {
		var eps []string
		for _, ep := range s.Endpoints {
			eps = append(eps, ep.Addr.String())
		}
		got = append(got, summary{s.Name.String(), s.Protocol.String() + "/" + s.ClusterIPs[0].String(),
			s.NodePort, s.Algorithm, s.AffinityTimeout, strings.Join(eps, ",")})
	}
	want := []summary{
		{"demo/web", "TCP/127.0.0.1", 30080, lb.RoundRobin, 0, "127.0.0.1:18081,127.0.0.1:18082"},
		{"demo/echo-sticky", "TCP/127.0.0.1", 0, lb.Maglev, lb.DefaultAffinityTimeout, "127.0.0.1:18091,127.0.0.1:18092"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("example services:\n got %+v\nwant %+v", got, want)
	}
}

func TestLoadMissingFile(t *testing.T) {
	path := t.TempDir() + "/missing.yaml"
	got, err := Load(path)
	if got != nil || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) {
		t.Errorf("Load(%q) = %v, %v; want nil and a not-exist error naming the path", path, got, err)
	}
}

func TestLoadNamesPath(t *testing.T) {
	path := t.TempDir() + "/services.yaml"
	writeFile(t, path, "services: [\n")
	if _, err := Load(path); !errors.Is(err, ErrInvalidFile) || !strings.Contains(err.Error(), path) {
		t.Errorf("Load error %v: want ErrInvalidFile naming %s", err, path)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(examples.Services)
	f.Add([]byte("services:\n  - name: web\n    clusterIP: 10.0.0.1\n    ports: [{name: a, port: 80}, {name: b, port: 81, protocol: UDP}]\n" +
		"    endpoints: [{ip: 10.1.0.1, ports: {a: 8080}}, {ip: 10.1.0.1}]\n"))
	f.Add([]byte("services:\n  - name: web\n    ports: [{port: 80, nodePort: 30080}]\n  - name: web\n    clusterIP: '::1'\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		services, err := Parse(data)
		if errors.Is(err, ErrInvalidFile) && services != nil {
			t.Fatalf("Parse returned %d services with ErrInvalidFile", len(services))
		}
		for i := range services {
			if verr := services[i].Validate(); verr != nil {
				t.Fatalf("Parse returned invalid service %v: %v", services[i].Name, verr)
			}
		}
		if err != nil && !errors.Is(err, ErrInvalidFile) {
			forEach(err, func(err error) {
				if !strings.HasPrefix(err.Error(), "line ") {
					t.Fatalf("error %q does not name its line", err)
				}
			})
		}
	})
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func addrPort(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
