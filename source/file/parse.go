// Package file loads lb.Services from a static YAML services file and keeps
// an lb.Store in step with it (Watcher).
//
// The format is kube-like. Every key is optional unless marked required;
// unknown keys are errors, so a typo never passes silently:
//
//	services:
//	  - name: web                   # required; a DNS label
//	    namespace: default          # default "default"
//	    clusterIPs: [127.0.0.1]     # or clusterIP: 127.0.0.1
//	    externalIPs: []
//	    loadBalancerIPs: []
//	    loadBalancerSourceRanges: [10.0.0.0/8]  # the only sources the loadBalancerIPs take; default: any
//	    sessionAffinity: ClientIP   # None (default) | ClientIP
//	    sessionAffinityTimeoutSeconds: 10800  # 1-86400; default 10800 with ClientIP
//	    internalTrafficPolicy: Cluster        # Cluster (default) | Local
//	    externalTrafficPolicy: Cluster        # Cluster (default) | Local
//	    healthCheckNodePort: 32000  # only with externalTrafficPolicy Local and loadBalancerIPs: kube-proxy's health check on this TCP port of the node
//	    algorithm: round-robin      # round-robin | random | least-conn | maglev; default: the Store's
//	    firstByteTimeout: 2s        # userspace TCP: reset and charge a backend silent this long after the client's first bytes; off by default
//	    ports:                      # required, at least one
//	      - name: http              # required when more than one port
//	        protocol: TCP           # TCP (default) | UDP | SCTP (served by the kernel modes only)
//	        port: 18080             # required, 1-65535
//	        targetPort: 8080        # default: port
//	        nodePort: 30080         # optional, 1-65535
//	    endpoints:
//	      - ip: 127.0.0.1           # required
//	        ready: true             # default true
//	        serving: true           # default: ready
//	        terminating: false      # default false
//	        nodeName: node-a
//	        zone: zone-a
//	        zoneHints: [zone-a]     # topology hints: the zones this endpoint serves
//	        nodeHints: [node-a]     # the nodes it serves (trafficDistribution PreferSameNode)
//	        ports: {http: 8081}     # overrides targetPort by port name ("" for an unnamed port)
//
// Hints narrow a Cluster traffic policy as kube-proxy's EndpointSlice hints
// do (lb.UsableEndpoints): node hints when every ready endpoint has some and
// one names this node (--hostname-override), else zone hints on the same
// terms with --zone, else every ready endpoint. Hint names must not be
// empty.
//
// The services key is required: a file serving no Services says
// `services: []`, so an empty or truncated file is an error, never "no
// Services". A service needs at least one of clusterIPs, externalIPs,
// loadBalancerIPs or a nodePort, and no two services may claim the same
// frontend (protocol, address, port) or nodePort (a healthCheckNodePort
// counts as a TCP nodePort). Each (service, port) pair becomes one
// lb.Service named {namespace, name, port name}, whose endpoints are
// ip:targetPort. YAML anchors and aliases are not supported.
package file

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/svcproxy/svcproxy/lb"
)

// ErrInvalidFile means the file as a whole is unusable: a YAML syntax error,
// more than one YAML document, or a top level that is not a services file.
// Parse then returns no Services, and a Watcher keeps the previous ones.
// (The package's only sentinel, so it lives here rather than in errors.go.)
var ErrInvalidFile = errors.New("invalid services file")

const (
	defaultNamespace   = "default"
	maxAffinitySeconds = 86400 // Kubernetes' upper bound for sessionAffinityTimeoutSeconds
)

// Load reads and parses the services file at path. Like Parse, it returns
// the valid Services together with an error listing every rejected one.
func Load(path string) ([]lb.Service, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading services file: %w", err)
	}
	services, err := Parse(data)
	if err != nil {
		return services, fmt.Errorf("loading %s: %w", path, err)
	}
	return services, nil
}

// Parse parses a services file (see the package documentation for the
// format). It finds every problem: a service with any is skipped and the
// others are still returned, in file order, together with an error joining
// one entry per problem, each naming its line and field path, e.g.
//
//	line 12: services[1].ports[0].port: must be in 1-65535
//
// (A Watcher applies a file only when Parse finds no problem at all.) If the
// file as a whole is unusable — a YAML syntax error, no services key, as in
// an empty or truncated file — the error wraps ErrInvalidFile and no
// Services are returned. Every Service returned passes lb.Service.Validate,
// and a Store takes them all without a frontend conflict.
func Parse(data []byte) ([]lb.Service, error) {
	root, err := decode(data)
	if err != nil {
		return nil, err
	}
	if root == nil {
		return nil, fmt.Errorf("%w: the file is empty (truncated?): write \"services: []\" to serve no Services", ErrInvalidFile)
	}
	p := &parser{}
	top, isMap := p.fields(root, "", "services")
	var items []*yaml.Node
	if n := top["services"]; n != nil {
		items, _ = p.list(n, "services")
	} else if isMap {
		p.errorf(root, "services", "required: write \"services: []\" to serve no Services")
	}
	if len(p.errs) > 0 {
		for _, e := range p.errs {
			e.whole = true
		}
		return nil, p.err()
	}

	var out []lb.Service
	names := make(map[string]int, len(items)) // namespace/name: line of its name
	held := claims{}
	for i, item := range items {
		path := fmt.Sprintf("services[%d]", i)
		before := len(p.errs)
		key, nameNode, services := p.service(item, path)
		if key != "" {
			if line, dup := names[key]; dup {
				p.errorf(nameNode, path+".name", "duplicate service %s (first at line %d)", key, line)
			} else {
				names[key] = nameNode.Line
			}
		}
		if len(p.errs) == before {
			held.claim(p, item, path, services)
		}
		if len(p.errs) == before {
			out = append(out, services...)
		}
	}
	return out, p.err()
}

// claims are the frontends and node ports the services so far hold, with
// the line of the service holding each: a Store gives a contested one to a
// single Service and drops it from the others, so a file must not contest
// any.
type claims map[lb.Frontend]claim // a node port's Addr holds only the port

type claim struct {
	owner lb.ServicePortName
	line  int
}

// claim records the frontends and node ports of services, the ports of the
// service at item, reporting each already held; a service with a conflict
// claims nothing.
func (c claims) claim(p *parser, item *yaml.Node, path string, services []lb.Service) {
	type want struct {
		f    lb.Frontend
		name lb.ServicePortName
		hc   bool // the service's healthCheckNodePort
	}
	var wants []want
	for i := range services {
		svc := &services[i]
		for _, ip := range slices.Concat(svc.ClusterIPs, svc.ExternalIPs, svc.LoadBalancerIPs) {
			wants = append(wants, want{lb.Frontend{Protocol: svc.Protocol, Addr: netip.AddrPortFrom(ip, svc.Port)}, svc.Name, false})
		}
		if svc.NodePort != 0 {
			wants = append(wants, want{lb.Frontend{Protocol: svc.Protocol, Addr: netip.AddrPortFrom(netip.Addr{}, svc.NodePort)}, svc.Name, false})
		}
	}
	if len(services) > 0 && services[0].HealthCheckNodePort != 0 { // the same on each port
		wants = append(wants, want{lb.Frontend{Protocol: lb.TCP, Addr: netip.AddrPortFrom(netip.Addr{}, services[0].HealthCheckNodePort)}, services[0].Name, true})
	}
	conflict := false
	for _, w := range wants {
		held, taken := c[w.f]
		switch {
		case !taken:
		case w.f.Addr.Addr().IsValid():
			p.errorf(item, path, "frontend %v already belongs to %v (line %d)", w.f, held.owner, held.line)
			conflict = true
		case w.hc:
			p.errorf(item, path+".healthCheckNodePort", "TCP port %d already belongs to %v (line %d)", w.f.Addr.Port(), held.owner, held.line)
			conflict = true
		default:
			p.errorf(item, path, "nodePort %v/%d already belongs to %v (line %d)", w.f.Protocol, w.f.Addr.Port(), held.owner, held.line)
			conflict = true
		}
	}
	if conflict {
		return
	}
	for _, w := range wants {
		c[w.f] = claim{w.name, item.Line}
	}
}

// decode returns the root node of data's only YAML document, or nil if data
// holds no document or an empty one.
func decode(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, fmt.Errorf("%w: %s", ErrInvalidFile, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, fmt.Errorf("%w: %s", ErrInvalidFile, strings.TrimPrefix(err.Error(), "yaml: "))
	default:
		return nil, fmt.Errorf("%w: line %d: only one YAML document is allowed", ErrInvalidFile, next.Line)
	}
	if len(doc.Content) == 0 {
		return nil, nil
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null" {
		return nil, nil
	}
	return root, nil
}

// fieldError is one problem in a services file.
type fieldError struct {
	line  int
	path  string // e.g. services[1].ports[0].port
	msg   string
	whole bool // the file is unusable as a whole: it is ErrInvalidFile
}

// Is makes a problem with the file as a whole match ErrInvalidFile.
func (e *fieldError) Is(target error) bool { return e.whole && target == ErrInvalidFile }

func (e *fieldError) Error() string {
	if e.path == "" {
		return fmt.Sprintf("line %d: %s", e.line, e.msg)
	}
	return fmt.Sprintf("line %d: %s: %s", e.line, e.path, e.msg)
}

// parser collects every problem in a file rather than stopping at the first.
type parser struct {
	errs []*fieldError
	seen map[fieldError]bool
}

func (p *parser) errorf(n *yaml.Node, path, format string, args ...any) {
	e := fieldError{line: n.Line, path: path, msg: fmt.Sprintf(format, args...)}
	// A problem shared by several ports of one service is reported once.
	if p.seen[e] {
		return
	}
	if p.seen == nil {
		p.seen = map[fieldError]bool{}
	}
	p.seen[e] = true
	p.errs = append(p.errs, &e)
}

// err joins the problems found so far, ordered by line.
func (p *parser) err() error {
	slices.SortStableFunc(p.errs, func(a, b *fieldError) int { return a.line - b.line })
	errs := make([]error, len(p.errs))
	for i, e := range p.errs {
		errs[i] = e
	}
	return errors.Join(errs...)
}

// service converts one entry of services into one lb.Service per port.
// key is "namespace/name" when the name is valid, for duplicate detection.
func (p *parser) service(n *yaml.Node, path string) (key string, nameNode *yaml.Node, out []lb.Service) {
	before := len(p.errs)
	f, ok := p.fields(n, path, "name", "namespace", "clusterIP", "clusterIPs", "externalIPs", "loadBalancerIPs",
		"loadBalancerSourceRanges", "sessionAffinity", "sessionAffinityTimeoutSeconds", "internalTrafficPolicy", "externalTrafficPolicy",
		"healthCheckNodePort", "algorithm", "firstByteTimeout", "ports", "endpoints")
	if !ok {
		return "", nil, nil
	}
	var base lb.Service

	base.Name.Namespace = defaultNamespace
	if v := f["namespace"]; v != nil {
		base.Name.Namespace, _ = p.label(v, path+".namespace")
	}
	if nameNode = f["name"]; nameNode == nil {
		p.errorf(n, path+".name", "required")
	} else if name, ok := p.label(nameNode, path+".name"); ok {
		base.Name.Name = name
		if base.Name.Namespace != "" {
			key = base.Name.Namespace + "/" + name
		}
	}

	frontendStart := len(p.errs)
	ips := map[netip.Addr]int{} // every frontend IP of the service: line
	addrs := func(field string) []netip.Addr {
		v := f[field]
		if v == nil {
			return nil
		}
		items, ok := p.list(v, path+"."+field)
		if !ok {
			return nil
		}
		out := make([]netip.Addr, 0, len(items))
		for i, item := range items {
			ipPath := fmt.Sprintf("%s.%s[%d]", path, field, i)
			ip, ok := p.addr(item, ipPath)
			if !ok {
				continue
			}
			if line, dup := ips[ip]; dup {
				p.errorf(item, ipPath, "duplicate address %v (first at line %d)", ip, line)
				continue
			}
			ips[ip] = item.Line
			out = append(out, ip)
		}
		return out
	}
	if v := f["clusterIP"]; v != nil {
		if f["clusterIPs"] != nil {
			p.errorf(v, path+".clusterIP", "set clusterIP or clusterIPs, not both")
		} else if ip, ok := p.addr(v, path+".clusterIP"); ok {
			ips[ip] = v.Line
			base.ClusterIPs = []netip.Addr{ip}
		}
	}
	if base.ClusterIPs == nil {
		base.ClusterIPs = addrs("clusterIPs")
	}
	base.ExternalIPs = addrs("externalIPs")
	base.LoadBalancerIPs = addrs("loadBalancerIPs")
	frontendErrs := len(p.errs) > frontendStart
	if v := f["loadBalancerSourceRanges"]; v != nil {
		items, _ := p.list(v, path+".loadBalancerSourceRanges")
		for i, item := range items {
			rPath := fmt.Sprintf("%s.loadBalancerSourceRanges[%d]", path, i)
			str, ok := p.str(item, rPath)
			if !ok {
				continue
			}
			r, err := netip.ParsePrefix(strings.TrimSpace(str))
			if err != nil {
				p.errorf(item, rPath, "%q is not a CIDR (e.g. 10.0.0.0/8)", str)
				continue
			}
			base.LoadBalancerSourceRanges = append(base.LoadBalancerSourceRanges, lb.SourceRange(r))
		}
	}

	clientIP, affinityErr := false, false // a timeout says nothing more after an affinity error
	if v := f["sessionAffinity"]; v != nil {
		if s, ok := p.str(v, path+".sessionAffinity"); ok {
			switch {
			case strings.EqualFold(s, "ClientIP"):
				clientIP = true
			case strings.EqualFold(s, "None"):
			default:
				p.errorf(v, path+".sessionAffinity", "unknown affinity %q (want None or ClientIP)", s)
				affinityErr = true
			}
		} else {
			affinityErr = true
		}
	}
	if clientIP {
		base.AffinityTimeout = lb.DefaultAffinityTimeout
	}
	if v := f["sessionAffinityTimeoutSeconds"]; v != nil {
		field := path + ".sessionAffinityTimeoutSeconds"
		if secs, ok := p.integer(v, field, 1, maxAffinitySeconds); ok {
			if clientIP {
				base.AffinityTimeout = time.Duration(secs) * time.Second
			} else if !affinityErr {
				p.errorf(v, field, "only valid with sessionAffinity: ClientIP")
			}
		}
	}

	base.InternalTrafficPolicy = p.policy(f["internalTrafficPolicy"], path+".internalTrafficPolicy")
	policyStart := len(p.errs)
	base.ExternalTrafficPolicy = p.policy(f["externalTrafficPolicy"], path+".externalTrafficPolicy")
	policyErr := len(p.errs) > policyStart // a healthCheckNodePort then says nothing more
	if v := f["algorithm"]; v != nil {
		if s, ok := p.str(v, path+".algorithm"); ok {
			algo, err := lb.ParseAlgorithm(s)
			if err != nil {
				p.errorf(v, path+".algorithm", "%v", err)
			}
			base.Algorithm = algo
		}
	}

	if v := f["firstByteTimeout"]; v != nil {
		if s, ok := p.str(v, path+".firstByteTimeout"); ok {
			d, err := time.ParseDuration(s)
			switch {
			case err != nil:
				p.errorf(v, path+".firstByteTimeout", "not a duration (e.g. 2s): %q", s)
			case d <= 0:
				p.errorf(v, path+".firstByteTimeout", "must be positive, got %v", d)
			default:
				base.FirstByteTimeout = d
			}
		}
	}

	var ports []portSpec
	if v := f["ports"]; v == nil {
		p.errorf(n, path+".ports", "required")
		frontendErrs = true // a nodePort may be missing with them
	} else {
		portStart := len(p.errs)
		ports = p.ports(v, path+".ports")
		frontendErrs = frontendErrs || len(p.errs) > portStart
	}
	var endpoints []endpointSpec
	if v := f["endpoints"]; v != nil {
		endpoints = p.endpoints(v, path+".endpoints", ports)
	}
	if v := f["healthCheckNodePort"]; v != nil {
		field := path + ".healthCheckNodePort"
		if port, ok := p.port(v, field); ok {
			switch {
			case policyErr:
			case base.ExternalTrafficPolicy != lb.PolicyLocal || len(base.LoadBalancerIPs) == 0:
				p.errorf(v, field, "only valid with externalTrafficPolicy: Local and loadBalancerIPs, as kube-proxy serves it for LoadBalancer Services only")
			case slices.ContainsFunc(ports, func(pt portSpec) bool { return pt.protocol == lb.TCP && pt.nodePort == port }):
				p.errorf(v, field, "%d is also a TCP nodePort of this service", port)
			default:
				base.HealthCheckNodePort = port
			}
		}
	}

	hasNodePort := slices.ContainsFunc(ports, func(pt portSpec) bool { return pt.nodePort != 0 })
	if len(ips) == 0 && !hasNodePort && !frontendErrs { // else already reported
		p.errorf(n, path, "a service needs at least one of clusterIPs, externalIPs, loadBalancerIPs or a nodePort")
	}

	for _, pt := range ports {
		svc := base
		svc.Name.Port = pt.name
		svc.Protocol = pt.protocol
		svc.Port = pt.port
		svc.NodePort = pt.nodePort
		seen := make(map[netip.AddrPort]int, len(endpoints)) // address: line
		for _, es := range endpoints {
			target := pt.targetPort
			if o, ok := es.ports[pt.name]; ok {
				target = o
			}
			ep := es.endpoint
			ep.Addr = netip.AddrPortFrom(es.ip, target)
			if line, dup := seen[ep.Addr]; dup {
				p.errorf(es.node, es.path, "duplicate endpoint %v (first at line %d)", ep.Addr, line)
				continue
			}
			seen[ep.Addr] = es.node.Line
			svc.Endpoints = append(svc.Endpoints, ep)
		}
		// A backstop: the checks above should leave Validate nothing to find.
		if len(p.errs) == before {
			forEach(svc.Validate(), func(err error) { p.errorf(n, path, "%v", err) })
		}
		out = append(out, svc)
	}
	return key, nameNode, out
}

// portSpec is one entry of a service's ports.
type portSpec struct {
	name       string
	protocol   lb.Protocol
	port       uint16
	targetPort uint16
	nodePort   uint16 // 0: none
}

func (p *parser) ports(n *yaml.Node, path string) []portSpec {
	items, ok := p.list(n, path)
	if !ok {
		return nil
	}
	if len(items) == 0 {
		p.errorf(n, path, "must list at least one port")
		return nil
	}
	type protoPort struct {
		proto lb.Protocol
		port  uint16
	}
	names := map[string]int{}
	ports := map[protoPort]int{}
	nodePorts := map[protoPort]int{}
	out := make([]portSpec, 0, len(items))
	for i, item := range items {
		path := fmt.Sprintf("%s[%d]", path, i)
		f, ok := p.fields(item, path, "name", "protocol", "port", "targetPort", "nodePort")
		if !ok {
			continue
		}
		var ps portSpec
		if v := f["name"]; v != nil {
			if name, ok := p.label(v, path+".name"); ok {
				if line, dup := names[name]; dup {
					p.errorf(v, path+".name", "duplicate port name %q (first at line %d)", name, line)
				} else {
					names[name] = v.Line
				}
				ps.name = name
			}
		} else if len(items) > 1 {
			p.errorf(item, path+".name", "required when a service has more than one port")
		}
		if v := f["protocol"]; v != nil {
			if s, ok := p.str(v, path+".protocol"); ok {
				proto, err := lb.ParseProtocol(s)
				if err != nil {
					p.errorf(v, path+".protocol", "%v", err)
				}
				ps.protocol = proto
			}
		}
		if v := f["port"]; v == nil {
			p.errorf(item, path+".port", "required")
		} else if port, ok := p.port(v, path+".port"); ok {
			k := protoPort{ps.protocol, port}
			if line, dup := ports[k]; dup {
				p.errorf(v, path+".port", "duplicate port %v/%d (first at line %d)", ps.protocol, port, line)
			} else {
				ports[k] = v.Line
			}
			ps.port = port
		}
		ps.targetPort = ps.port
		if v := f["targetPort"]; v != nil {
			ps.targetPort, _ = p.port(v, path+".targetPort")
		}
		if v := f["nodePort"]; v != nil {
			if port, ok := p.port(v, path+".nodePort"); ok {
				k := protoPort{ps.protocol, port}
				if line, dup := nodePorts[k]; dup {
					p.errorf(v, path+".nodePort", "duplicate nodePort %v/%d (first at line %d)", ps.protocol, port, line)
				} else {
					nodePorts[k] = v.Line
				}
				ps.nodePort = port
			}
		}
		out = append(out, ps)
	}
	return out
}

// endpointSpec is one entry of a service's endpoints, before it is given a
// port.
type endpointSpec struct {
	node     *yaml.Node
	path     string
	ip       netip.Addr
	ports    map[string]uint16 // targetPort overrides by port name
	endpoint lb.Endpoint       // everything but Addr
}

func (p *parser) endpoints(n *yaml.Node, path string, ports []portSpec) []endpointSpec {
	items, ok := p.list(n, path)
	if !ok {
		return nil
	}
	out := make([]endpointSpec, 0, len(items))
	for i, item := range items {
		path := fmt.Sprintf("%s[%d]", path, i)
		f, ok := p.fields(item, path, "ip", "ready", "serving", "terminating", "nodeName", "zone", "zoneHints", "nodeHints", "ports")
		if !ok {
			continue
		}
		es := endpointSpec{node: item, path: path}
		if v := f["ip"]; v == nil {
			p.errorf(item, path+".ip", "required")
		} else {
			es.ip, _ = p.addr(v, path+".ip")
		}
		ep := &es.endpoint
		ep.Ready = true
		if v := f["ready"]; v != nil {
			ep.Ready, _ = p.boolean(v, path+".ready")
		}
		ep.Serving = ep.Ready
		if v := f["serving"]; v != nil {
			ep.Serving, _ = p.boolean(v, path+".serving")
		}
		if v := f["terminating"]; v != nil {
			ep.Terminating, _ = p.boolean(v, path+".terminating")
		}
		if v := f["nodeName"]; v != nil {
			ep.NodeName, _ = p.str(v, path+".nodeName")
		}
		if v := f["zone"]; v != nil {
			ep.Zone, _ = p.str(v, path+".zone")
		}
		ep.ZoneHints = p.hints(f["zoneHints"], path+".zoneHints")
		ep.NodeHints = p.hints(f["nodeHints"], path+".nodeHints")
		if v := f["ports"]; v != nil {
			es.ports = p.portOverrides(v, path+".ports", ports)
		}
		out = append(out, es)
	}
	return out
}

// hints parses a list of zone or node names (nil n: none). An empty name
// could never match and is an error.
func (p *parser) hints(n *yaml.Node, path string) []string {
	if n == nil {
		return nil
	}
	items, ok := p.list(n, path)
	if !ok {
		return nil
	}
	var out []string
	for j, h := range items {
		field := fmt.Sprintf("%s[%d]", path, j)
		if s, ok := p.str(h, field); ok {
			if s == "" {
				p.errorf(h, field, "must not be empty")
				continue
			}
			out = append(out, s)
		}
	}
	return out
}

// portOverrides parses an endpoint's {port name: target port} mapping.
func (p *parser) portOverrides(n *yaml.Node, path string, ports []portSpec) map[string]uint16 {
	pairs, ok := p.pairs(n, path)
	if !ok {
		return nil
	}
	out := make(map[string]uint16, len(pairs))
	for _, kv := range pairs {
		field := join(path, kv.key.Value)
		if !slices.ContainsFunc(ports, func(pt portSpec) bool { return pt.name == kv.key.Value }) {
			p.errorf(kv.key, field, "the service has no port named %q", kv.key.Value)
			continue
		}
		if port, ok := p.port(kv.value, field); ok {
			out[kv.key.Value] = port
		}
	}
	return out
}

func (p *parser) policy(n *yaml.Node, path string) lb.TrafficPolicy {
	if n == nil {
		return lb.PolicyCluster
	}
	s, ok := p.str(n, path)
	switch {
	case !ok:
	case strings.EqualFold(s, "Cluster"):
	case strings.EqualFold(s, "Local"):
		return lb.PolicyLocal
	default:
		p.errorf(n, path, "unknown traffic policy %q (want Cluster or Local)", s)
	}
	return lb.PolicyCluster
}

// keyValue is one entry of a YAML mapping.
type keyValue struct{ key, value *yaml.Node }

// pairs returns the entries of mapping n, reporting non-string and
// duplicate keys.
func (p *parser) pairs(n *yaml.Node, path string) ([]keyValue, bool) {
	if !p.expect(n, path, yaml.MappingNode) {
		return nil, false
	}
	out := make([]keyValue, 0, len(n.Content)/2)
	lines := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			p.errorf(k, path, "keys must be strings, got %s", describe(k))
			continue
		}
		if line, dup := lines[k.Value]; dup {
			p.errorf(k, join(path, k.Value), "duplicate key (first at line %d)", line)
			continue
		}
		lines[k.Value] = k.Line
		out = append(out, keyValue{k, v})
	}
	return out, true
}

// fields returns the values of mapping n by key, leaving out null ones
// (an empty value means "not set"). Keys other than known are errors.
func (p *parser) fields(n *yaml.Node, path string, known ...string) (map[string]*yaml.Node, bool) {
	pairs, ok := p.pairs(n, path)
	if !ok {
		return nil, false
	}
	out := make(map[string]*yaml.Node, len(pairs))
	for _, kv := range pairs {
		if !slices.Contains(known, kv.key.Value) {
			p.errorf(kv.key, join(path, kv.key.Value), "unknown key%s", suggest(kv.key.Value, known))
			continue
		}
		if kv.value.Kind == yaml.ScalarNode && kv.value.ShortTag() == "!!null" {
			continue
		}
		out[kv.key.Value] = kv.value
	}
	return out, true
}

// suggest returns a hint for an unknown key: the known key it differs from
// only in case, if any.
func suggest(key string, known []string) string {
	if key == "<<" {
		return " (YAML merge keys are not supported)"
	}
	for _, k := range known {
		if strings.EqualFold(k, key) {
			return fmt.Sprintf(" (did you mean %s?)", k)
		}
	}
	return ""
}

func (p *parser) list(n *yaml.Node, path string) ([]*yaml.Node, bool) {
	if !p.expect(n, path, yaml.SequenceNode) {
		return nil, false
	}
	return n.Content, true
}

func (p *parser) str(n *yaml.Node, path string) (string, bool) {
	if !p.expect(n, path, yaml.ScalarNode) {
		return "", false
	}
	if n.ShortTag() != "!!str" {
		p.errorf(n, path, "must be a string, got %s", describe(n))
		return "", false
	}
	return n.Value, true
}

// label parses a Kubernetes-style name: a DNS label (RFC 1123) of at most
// 63 lowercase letters, digits and '-', starting and ending with a letter or
// digit.
func (p *parser) label(n *yaml.Node, path string) (string, bool) {
	s, ok := p.str(n, path)
	if !ok {
		return "", false
	}
	valid := len(s) > 0 && len(s) <= 63 && s[0] != '-' && s[len(s)-1] != '-'
	for _, c := range []byte(s) {
		valid = valid && (c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-')
	}
	if !valid {
		p.errorf(n, path, "%.64q is not a valid name (lowercase letters, digits and '-', at most 63)", s)
		return "", false
	}
	return s, true
}

func (p *parser) integer(n *yaml.Node, path string, lo, hi int64) (int64, bool) {
	if !p.expect(n, path, yaml.ScalarNode) {
		return 0, false
	}
	if n.ShortTag() != "!!int" {
		p.errorf(n, path, "must be an integer, got %s", describe(n))
		return 0, false
	}
	var v int64
	if err := n.Decode(&v); err != nil || v < lo || v > hi {
		p.errorf(n, path, "must be in %d-%d", lo, hi)
		return 0, false
	}
	return v, true
}

func (p *parser) port(n *yaml.Node, path string) (uint16, bool) {
	v, ok := p.integer(n, path, 1, 65535)
	return uint16(v), ok
}

func (p *parser) boolean(n *yaml.Node, path string) (bool, bool) {
	if !p.expect(n, path, yaml.ScalarNode) {
		return false, false
	}
	var v bool
	if n.ShortTag() != "!!bool" || n.Decode(&v) != nil {
		p.errorf(n, path, "must be true or false, got %s", describe(n))
		return false, false
	}
	return v, true
}

// addr parses an IP address a service can be reached on or an endpoint
// run at: not unspecified or multicast. IPv4-mapped IPv6 addresses are
// returned in their IPv4 form.
func (p *parser) addr(n *yaml.Node, path string) (netip.Addr, bool) {
	s, ok := p.str(n, path)
	if !ok {
		return netip.Addr{}, false
	}
	ip, err := netip.ParseAddr(s)
	if err != nil {
		p.errorf(n, path, "invalid IP address %.64q", s)
		return netip.Addr{}, false
	}
	if ip.IsUnspecified() || ip.IsMulticast() {
		p.errorf(n, path, "%v is unspecified or multicast", ip)
		return netip.Addr{}, false
	}
	return ip.Unmap(), true
}

// expect reports whether n is of the given kind, and records an error if not.
func (p *parser) expect(n *yaml.Node, path string, kind yaml.Kind) bool {
	switch {
	case n.Kind == kind:
		return true
	case n.Kind == yaml.AliasNode:
		p.errorf(n, path, "YAML aliases are not supported")
	case kind == yaml.MappingNode:
		p.errorf(n, path, "must be a mapping, got %s", describe(n))
	case kind == yaml.SequenceNode:
		p.errorf(n, path, "must be a list, got %s", describe(n))
	default:
		p.errorf(n, path, "must be a single value, got %s", describe(n))
	}
	return false
}

// describe names n's type and, for scalars, its value, for error messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	names := map[string]string{"!!str": "string", "!!int": "integer", "!!float": "number", "!!bool": "boolean", "!!null": "null"}
	tag := n.ShortTag()
	name, ok := names[tag]
	if !ok {
		name = "value tagged " + tag
	}
	if tag == "!!null" {
		return name
	}
	return fmt.Sprintf("%s %.64q", name, n.Value)
}

// join appends key to a field path, quoting keys that are not plain words.
func join(path, key string) string {
	if key == "" || strings.ContainsAny(key, ".[]\"' \t\n") {
		return path + "[" + strconv.Quote(key) + "]"
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

// forEach calls fn for every error joined (errors.Join) into err, or for err
// itself if it joins none.
func forEach(err error, fn func(error)) {
	if err == nil {
		return
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			forEach(e, fn)
		}
		return
	}
	fn(err)
}
