package lb

import (
	"net/netip"
	"slices"
	"testing"
)

// kpEndpoint is an endpoint as kube-proxy's topology tests write one
// (BaseEndpointInfo): conditions, whether it is on this node, its hints.
type kpEndpoint struct {
	addr                        string
	ready, serving, terminating bool
	local                       bool
	zones, nodes                []string // hints
}

// kpCase is one case of kube-proxy v1.34's TestCategorizeEndpoints
// (pkg/proxy/topology_test.go), as data: the node, the Service port's
// policies, the endpoints, and the cluster and local endpoints kube-proxy
// expects (nil where it uses none of that kind).
type kpCase struct {
	name          string
	gateOff       bool // PreferSameTrafficDistribution disabled
	nodeName      string
	zone          string // the Node's topology.kubernetes.io/zone label
	internalLocal bool
	externalLocal bool
	nodePort      uint16 // non-zero: externally accessible
	endpoints     []kpEndpoint
	cluster       []string
	local         []string
}

// r is a ready endpoint with zone hints, and node hints after "/".
func r(addr string, hints ...string) kpEndpoint {
	e := kpEndpoint{addr: addr, ready: true}
	i := slices.Index(hints, "/")
	if i < 0 {
		i = len(hints)
	} else {
		e.nodes = hints[i+1:]
	}
	e.zones = hints[:i]
	return e
}

func (e kpEndpoint) onNode() kpEndpoint { e.local = true; return e }

func unready(addr string, zones ...string) kpEndpoint { return kpEndpoint{addr: addr, zones: zones} }

func servTerm(addr string) kpEndpoint {
	return kpEndpoint{addr: addr, serving: true, terminating: true}
}

var kubeProxyCases = []kpCase{{
	name: "should use topology since all endpoints have hints, node has a zone label and and there are endpoints for the node's zone",
	zone: "zone-a",
	endpoints: []kpEndpoint{r("10.1.2.3:80", "zone-a"), r("10.1.2.4:80", "zone-b"),
		r("10.1.2.5:80", "zone-c"), r("10.1.2.6:80", "zone-a")},
	cluster: []string{"10.1.2.3:80", "10.1.2.6:80"},
}, {
	name: "externalTrafficPolicy: Local, topology ignored for Local endpoints",
	zone: "zone-a", externalLocal: true, nodePort: 8080,
	endpoints: []kpEndpoint{r("10.1.2.3:80", "zone-a").onNode(), r("10.1.2.4:80", "zone-b").onNode(),
		r("10.1.2.5:80", "zone-c"), r("10.1.2.6:80", "zone-a")},
	cluster: []string{"10.1.2.3:80", "10.1.2.6:80"},
	local:   []string{"10.1.2.3:80", "10.1.2.4:80"},
}, {
	name: "internalTrafficPolicy: Local, topology ignored for Local endpoints",
	zone: "zone-a", internalLocal: true, nodePort: 8080,
	endpoints: []kpEndpoint{r("10.1.2.3:80", "zone-a").onNode(), r("10.1.2.4:80", "zone-b").onNode(),
		r("10.1.2.5:80", "zone-c"), r("10.1.2.6:80", "zone-a")},
	cluster: []string{"10.1.2.3:80", "10.1.2.6:80"},
	local:   []string{"10.1.2.3:80", "10.1.2.4:80"},
}, {
	name:      "empty node labels",
	endpoints: []kpEndpoint{r("10.1.2.3:80", "zone-a")},
	cluster:   []string{"10.1.2.3:80"},
}, {
	name:      "empty zone label",
	zone:      "",
	endpoints: []kpEndpoint{r("10.1.2.3:80", "zone-a")},
	cluster:   []string{"10.1.2.3:80"},
}, {
	name:      "node in different zone, no endpoint filtering",
	zone:      "zone-b",
	endpoints: []kpEndpoint{r("10.1.2.3:80", "zone-a")},
	cluster:   []string{"10.1.2.3:80"},
}, {
	name: "unready endpoint",
	zone: "zone-a",
	endpoints: []kpEndpoint{r("10.1.2.3:80", "zone-a"), r("10.1.2.4:80", "zone-b"),
		r("10.1.2.5:80", "zone-c"), unready("10.1.2.6:80", "zone-a")},
	cluster: []string{"10.1.2.3:80"},
}, {
	name: "only unready endpoints in same zone (should not filter)",
	zone: "zone-a",
	endpoints: []kpEndpoint{unready("10.1.2.3:80", "zone-a"), r("10.1.2.4:80", "zone-b"),
		r("10.1.2.5:80", "zone-c"), unready("10.1.2.6:80", "zone-a")},
	cluster: []string{"10.1.2.4:80", "10.1.2.5:80"},
}, {
	name: "missing hints, no filtering applied",
	zone: "zone-a",
	endpoints: []kpEndpoint{r("10.1.2.3:80", "zone-a"), r("10.1.2.4:80", "zone-b"),
		r("10.1.2.5:80"), r("10.1.2.6:80", "zone-a")},
	cluster: []string{"10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"},
}, {
	name: "multiple hints per endpoint, filtering includes any endpoint with zone included",
	zone: "zone-c",
	endpoints: []kpEndpoint{r("10.1.2.3:80", "zone-a", "zone-b", "zone-c"), r("10.1.2.4:80", "zone-b", "zone-c"),
		r("10.1.2.5:80", "zone-b", "zone-d"), r("10.1.2.6:80", "zone-c")},
	cluster: []string{"10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"},
}, {
	name:    "PreferSameNode falls back to same-zone when feature gate disabled",
	gateOff: true, nodeName: "node-1", zone: "zone-a",
	endpoints: []kpEndpoint{r("10.1.2.3:80", "zone-a", "/", "node-1"), r("10.1.2.4:80", "zone-b", "/", "node-2"),
		r("10.1.2.5:80", "zone-c", "/", "node-3"), r("10.1.2.6:80", "zone-a", "/", "node-4")},
	cluster: []string{"10.1.2.3:80", "10.1.2.6:80"},
}, {
	name:     "PreferSameNode available",
	nodeName: "node-1", zone: "zone-a",
	endpoints: []kpEndpoint{r("10.1.2.3:80", "zone-a", "/", "node-1"), r("10.1.2.4:80", "zone-b", "/", "node-2"),
		r("10.1.2.5:80", "zone-c", "/", "node-3"), r("10.1.2.6:80", "zone-a", "/", "node-4")},
	cluster: []string{"10.1.2.3:80"},
}, {
	name:     "PreferSameNode ignored if some endpoints unhinted",
	nodeName: "node-1", zone: "zone-a",
	endpoints: []kpEndpoint{r("10.1.2.3:80", "zone-a", "/", "node-1"), r("10.1.2.4:80"),
		r("10.1.2.5:80", "zone-c", "/", "node-3"), r("10.1.2.6:80", "zone-a", "/", "node-4")},
	cluster: []string{"10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"},
}, {
	name:     "PreferSameNode falls back to PreferSameZone if no endpoint for node",
	nodeName: "node-0", zone: "zone-a",
	endpoints: []kpEndpoint{r("10.1.2.3:80", "zone-a", "/", "node-1"), r("10.1.2.4:80", "zone-b", "/", "node-2"),
		r("10.1.2.5:80", "zone-c", "/", "node-3"), r("10.1.2.6:80", "zone-a", "/", "node-4")},
	cluster: []string{"10.1.2.3:80", "10.1.2.6:80"},
}, {
	name: "conflicting topology and localness require merging allEndpoints",
	zone: "zone-a", externalLocal: true, nodePort: 8080,
	endpoints: []kpEndpoint{r("10.0.0.0:80", "zone-a").onNode(), r("10.0.0.1:80", "zone-b").onNode(),
		r("10.0.0.2:80", "zone-a"), r("10.0.0.3:80", "zone-b")},
	cluster: []string{"10.0.0.0:80", "10.0.0.2:80"},
	local:   []string{"10.0.0.0:80", "10.0.0.1:80"},
}, {
	name:          "internalTrafficPolicy: Local, with empty endpoints",
	internalLocal: true,
	local:         []string{},
}, {
	name:          "internalTrafficPolicy: Local, but all endpoints are remote",
	internalLocal: true,
	endpoints:     []kpEndpoint{r("10.0.0.0:80"), r("10.0.0.1:80")},
	local:         []string{},
}, {
	name:          "internalTrafficPolicy: Local, all endpoints are local",
	internalLocal: true,
	endpoints:     []kpEndpoint{r("10.0.0.0:80").onNode(), r("10.0.0.1:80").onNode()},
	local:         []string{"10.0.0.0:80", "10.0.0.1:80"},
}, {
	name:          "internalTrafficPolicy: Local, some endpoints are local",
	internalLocal: true,
	endpoints:     []kpEndpoint{r("10.0.0.0:80").onNode(), r("10.0.0.1:80")},
	local:         []string{"10.0.0.0:80"},
}, {
	name:      "Cluster traffic policy, endpoints not Ready",
	endpoints: []kpEndpoint{unready("10.0.0.0:80"), unready("10.0.0.1:80")},
	cluster:   []string{},
}, {
	name:      "Cluster traffic policy, some endpoints are Ready",
	endpoints: []kpEndpoint{unready("10.0.0.0:80"), r("10.0.0.1:80")},
	cluster:   []string{"10.0.0.1:80"},
}, {
	name:      "Cluster traffic policy, all endpoints are terminating",
	endpoints: []kpEndpoint{servTerm("10.0.0.0:80").onNode(), servTerm("10.0.0.1:80")},
	cluster:   []string{"10.0.0.0:80", "10.0.0.1:80"},
}, {
	name:          "iTP: Local, eTP: Cluster, some endpoints local",
	internalLocal: true, nodePort: 8080,
	endpoints: []kpEndpoint{r("10.0.0.0:80").onNode(), r("10.0.0.1:80")},
	cluster:   []string{"10.0.0.0:80", "10.0.0.1:80"},
	local:     []string{"10.0.0.0:80"},
}, {
	name:          "iTP: Cluster, eTP: Local, some endpoints local",
	externalLocal: true, nodePort: 8080,
	endpoints: []kpEndpoint{r("10.0.0.0:80").onNode(), r("10.0.0.1:80")},
	cluster:   []string{"10.0.0.0:80", "10.0.0.1:80"},
	local:     []string{"10.0.0.0:80"},
}, {
	name:          "iTP: Local, eTP: Local, some endpoints local",
	internalLocal: true, externalLocal: true, nodePort: 8080,
	endpoints: []kpEndpoint{r("10.0.0.0:80").onNode(), r("10.0.0.1:80")},
	cluster:   []string{"10.0.0.0:80", "10.0.0.1:80"},
	local:     []string{"10.0.0.0:80"},
}, {
	name:          "iTP: Local, eTP: Local, all endpoints remote",
	internalLocal: true, externalLocal: true, nodePort: 8080,
	endpoints: []kpEndpoint{r("10.0.0.0:80"), r("10.0.0.1:80")},
	cluster:   []string{"10.0.0.0:80", "10.0.0.1:80"},
	local:     []string{},
}, {
	name:          "iTP: Local, eTP: Local, all endpoints remote and terminating",
	internalLocal: true, externalLocal: true, nodePort: 8080,
	endpoints: []kpEndpoint{servTerm("10.0.0.0:80"), servTerm("10.0.0.1:80")},
	cluster:   []string{"10.0.0.0:80", "10.0.0.1:80"},
	local:     []string{},
}, {
	name:          "iTP: Cluster, eTP: Local, with terminating endpoints",
	externalLocal: true, nodePort: 8080,
	endpoints: []kpEndpoint{r("10.0.0.0:80"), kpEndpoint{addr: "10.0.0.1:80", local: true},
		servTerm("10.0.0.2:80").onNode(), servTerm("10.0.0.3:80")},
	cluster: []string{"10.0.0.0:80"},
	local:   []string{"10.0.0.2:80"},
}, {
	name:          "externalTrafficPolicy ignored if not externally accessible",
	externalLocal: true,
	endpoints:     []kpEndpoint{r("10.0.0.0:80"), r("10.0.0.1:80").onNode()},
	cluster:       []string{"10.0.0.0:80", "10.0.0.1:80"},
}, {
	name:          "no cluster endpoints for iTP:Local internal-only service",
	internalLocal: true,
	endpoints:     []kpEndpoint{r("10.0.0.0:80"), r("10.0.0.1:80").onNode()},
	local:         []string{"10.0.0.1:80"},
}, {
	name:    "empty endpoints when no service endpoints exist",
	cluster: []string{},
}}

// TestUsableEndpointsKubeProxyCases runs kube-proxy's own
// CategorizeEndpoints cases through UsableEndpoints. kube-proxy returns
// cluster and local endpoints; UsableEndpoints returns the pools the two
// policies pick from them: internal is the local endpoints under an
// internal policy of Local, else the cluster ones; external likewise by
// the external policy, for a Service that is externally accessible (the
// external pool of one that is not is never used); the short circuit of an
// external policy of Local is the cluster endpoints. As source/kube does,
// an external policy of Local is set only on an externally accessible
// Service. kube-proxy's feature gate PreferSameTrafficDistribution is on
// in 1.34; with it off its EndpointSlice cache drops forNodes hints, so
// the gate-off case runs without node hints.
func TestUsableEndpointsKubeProxyCases(t *testing.T) {
	for _, tc := range kubeProxyCases {
		t.Run(tc.name, func(t *testing.T) {
			node := Node{Name: tc.nodeName, Zone: tc.zone}
			if node.Name == "" {
				node.Name = "this-node"
			}
			svc := &Service{NodePort: tc.nodePort}
			if tc.internalLocal {
				svc.InternalTrafficPolicy = PolicyLocal
			}
			if tc.externalLocal && tc.nodePort != 0 {
				svc.ExternalTrafficPolicy = PolicyLocal
			}
			for _, e := range tc.endpoints {
				ep := Endpoint{Addr: netip.MustParseAddrPort(e.addr), Ready: e.ready, Serving: e.serving,
					Terminating: e.terminating, NodeName: "other-node", ZoneHints: e.zones, NodeHints: e.nodes}
				if e.local {
					ep.NodeName = node.Name
				}
				if tc.gateOff {
					ep.NodeHints = nil
				}
				svc.Endpoints = append(svc.Endpoints, ep)
			}
			internal, external, short := UsableEndpoints(svc, node)
			pick := func(local bool) []string {
				want := tc.cluster
				if local {
					want = tc.local
				}
				want = slices.Clone(want)
				slices.Sort(want)
				return want
			}
			if got, want := sortedAddrs(internal), pick(tc.internalLocal); !slices.Equal(got, want) {
				t.Errorf("internal = %v, want kube-proxy's %v", got, want)
			}
			if tc.nodePort == 0 {
				return
			}
			if got, want := sortedAddrs(external), pick(tc.externalLocal); !slices.Equal(got, want) {
				t.Errorf("external = %v, want kube-proxy's %v", got, want)
			}
			// kube-proxy computes the Cluster endpoints of an externally
			// accessible Service whatever its policies, for the short
			// circuit of an external policy of Local.
			if got, want := sortedAddrs(short), pick(false); tc.externalLocal && !slices.Equal(got, want) {
				t.Errorf("short circuit = %v, want kube-proxy's cluster endpoints %v", got, want)
			}
		})
	}
}

func sortedAddrs(eps []Endpoint) []string {
	out := []string{}
	for _, ep := range eps {
		out = append(out, ep.Addr.String())
	}
	slices.Sort(out)
	return out
}
