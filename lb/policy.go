package lb

// Node is what the policy needs to know of the node it runs on.
type Node struct {
	Name string // matched against Endpoint.NodeName for Local traffic policies
	Zone string // matched against Endpoint.ZoneHints for topology-aware routing
}

// UsableEndpoints is the one policy that decides which endpoints of svc a
// connection may reach, for traffic addressed to a ClusterIP (internal) and
// to a NodePort, ExternalIP or LoadBalancer IP (external). Every mode uses it;
// it mirrors kube-proxy's CategorizeEndpoints:
//
//   - Cluster policy: ready endpoints, narrowed by topology hints when every
//     ready endpoint has hints and some are for this node's zone; when no
//     endpoint is ready, the serving and terminating ones, hints ignored (so
//     a rolling update never blackholes traffic).
//   - Local policy: the same, among endpoints on this node only; it never
//     falls back to other nodes.
//
// The returned slices are freshly allocated; internal and external may be the
// same slice when both policies are Cluster or both are Local.
func UsableEndpoints(svc *Service, node Node) (internal, external []Endpoint) {
	needCluster := svc.InternalTrafficPolicy == PolicyCluster || svc.ExternalTrafficPolicy == PolicyCluster
	needLocal := svc.InternalTrafficPolicy == PolicyLocal || svc.ExternalTrafficPolicy == PolicyLocal

	var cluster, local []Endpoint
	if needCluster {
		var ready bool
		if cluster, ready = usable(svc.Endpoints, nil); ready {
			cluster = topologyFilter(cluster, node.Zone)
		}
	}
	if needLocal {
		isLocal := func(ep *Endpoint) bool { return ep.NodeName != "" && ep.NodeName == node.Name }
		local, _ = usable(svc.Endpoints, isLocal)
	}
	internal, external = cluster, cluster
	if svc.InternalTrafficPolicy == PolicyLocal {
		internal = local
	}
	if svc.ExternalTrafficPolicy == PolicyLocal {
		external = local
	}
	return internal, external
}

// usable returns the ready endpoints that pass keep, or, when there are none,
// the serving and terminating ones; ready says which.
func usable(eps []Endpoint, keep func(*Endpoint) bool) (out []Endpoint, ready bool) {
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
		return readyEps, true
	}
	return fallback, false
}

// topologyFilter narrows eps to those hinted for zone, as kube-proxy does:
// only when every endpoint carries hints and at least one names this zone;
// otherwise all of eps, so a half-rolled-out hint set never strands traffic.
func topologyFilter(eps []Endpoint, zone string) []Endpoint {
	if zone == "" || len(eps) == 0 {
		return eps
	}
	var inZone []Endpoint
	for _, ep := range eps {
		if len(ep.ZoneHints) == 0 {
			return eps
		}
		for _, z := range ep.ZoneHints {
			if z == zone {
				inZone = append(inZone, ep)
				break
			}
		}
	}
	if len(inZone) == 0 {
		return eps
	}
	return inZone
}
