package lb

import "slices"

// Node is what the policy needs to know of the node it runs on.
type Node struct {
	Name string // matched against Endpoint.NodeName (Local policies) and Endpoint.NodeHints
	Zone string // matched against Endpoint.ZoneHints
}

// UsableEndpoints is the one policy that decides which endpoints of svc a
// connection may reach, for traffic addressed to a ClusterIP (internal) and
// to a NodePort, ExternalIP or LoadBalancer IP (external). Every mode uses it;
// it mirrors kube-proxy's CategorizeEndpoints (pkg/proxy/topology.go, with
// PreferSameTrafficDistribution on, as in Kubernetes 1.34):
//
//   - Cluster policy: ready endpoints, narrowed by topology hints (see
//     topologyMode: this node's hints when every ready endpoint has node
//     hints and one names this node, else this zone's on the same terms,
//     else none); when no endpoint is ready, the serving and terminating
//     ones, hints ignored (so a rolling update never blackholes traffic).
//   - Local policy: the same, among endpoints on this node only, hints
//     ignored; it never falls back to other nodes.
//
// The external result is meaningful for a Service with external frontends
// (a NodePort, ExternalIPs or LoadBalancer IPs), which is when sources set
// an external policy of Local, as kube-proxy honours it.
//
// shortCircuit is nil unless the external policy is Local: then it is the
// Cluster policy's endpoints, which serve a client inside the cluster (a
// pod, or the node itself) that addresses an external frontend. kube-proxy
// short-circuits such traffic (its KUBE-EXT chains) as if it had gone out
// to the load balancer and come back in through a node that has
// endpoints: subject to neither policy. Without it a pod could not reach
// an ingress controller through its LoadBalancer IP from a node the
// controller does not run on.
//
// The returned slices are freshly allocated; they may be the same slice
// when their policies agree.
func UsableEndpoints(svc *Service, node Node) (internal, external, shortCircuit []Endpoint) {
	// The Cluster policy's endpoints are needed whatever the policies: by
	// either one of Cluster, else by the external one's short circuit.
	var keep func(*Endpoint) bool
	switch topologyMode(svc.Endpoints, node) {
	case topologyNode:
		keep = func(ep *Endpoint) bool { return slices.Contains(ep.NodeHints, node.Name) }
	case topologyZone:
		keep = func(ep *Endpoint) bool { return slices.Contains(ep.ZoneHints, node.Zone) }
	}
	// With a topology mode, some ready endpoint passes keep, so the
	// serving-terminating fallback (which ignores keep) is only ever
	// taken when no endpoint at all is ready, as kube-proxy does.
	cluster := usable(svc.Endpoints, keep)
	var local []Endpoint
	if svc.InternalTrafficPolicy == PolicyLocal || svc.ExternalTrafficPolicy == PolicyLocal {
		isLocal := func(ep *Endpoint) bool { return ep.NodeName != "" && ep.NodeName == node.Name }
		local = usable(svc.Endpoints, isLocal)
	}
	internal, external = cluster, cluster
	if svc.InternalTrafficPolicy == PolicyLocal {
		internal = local
	}
	if svc.ExternalTrafficPolicy == PolicyLocal {
		external, shortCircuit = local, cluster
	}
	return internal, external, shortCircuit
}

// usable returns the ready endpoints that pass keep, or, when there are none,
// the serving and terminating ones that do.
func usable(eps []Endpoint, keep func(*Endpoint) bool) []Endpoint {
	var readyEps, fallback []Endpoint
	for i := range eps {
		ep := &eps[i]
		if keep != nil && !keep(ep) {
			continue
		}
		switch {
		case ep.Ready:
			readyEps = append(readyEps, *ep)
		case ep.Serving && ep.Terminating:
			fallback = append(fallback, *ep)
		}
	}
	if len(readyEps) > 0 {
		return readyEps
	}
	return fallback
}

// topology is how a Cluster policy narrows its ready endpoints.
type topology uint8

const (
	topologyNone topology = iota // every ready endpoint
	topologyNode                 // those hinted for this node (trafficDistribution PreferSameNode)
	topologyZone                 // those hinted for this node's zone (PreferSameZone, PreferClose, topology-aware routing)
)

// topologyMode is kube-proxy's topologyModeFromHints: among the ready
// endpoints, node hints are used when every one has some and one names
// this node; otherwise zone hints, on the same terms with this node's zone;
// otherwise none. A half-rolled-out hint set, or hints that leave this
// node or zone nothing, never strand traffic.
func topologyMode(eps []Endpoint, node Node) topology {
	anyReady := false
	allNodeHints, forNode := true, false
	allZoneHints, forZone := true, false
	for i := range eps {
		ep := &eps[i]
		if !ep.Ready {
			continue
		}
		anyReady = true
		if len(ep.NodeHints) == 0 {
			allNodeHints = false
		} else if slices.Contains(ep.NodeHints, node.Name) {
			forNode = true
		}
		if len(ep.ZoneHints) == 0 {
			allZoneHints = false
		} else if slices.Contains(ep.ZoneHints, node.Zone) {
			forZone = true
		}
	}
	switch {
	case !anyReady:
		return topologyNone
	case allNodeHints && forNode:
		return topologyNode
	case allZoneHints && forZone:
		return topologyZone
	}
	return topologyNone
}
