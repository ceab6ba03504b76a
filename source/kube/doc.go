// Package kube feeds lb.Store from a Kubernetes API server, as kube-proxy
// does: client-go shared informers for Services, discovery.k8s.io/v1
// EndpointSlices (never v1 Endpoints) and the node's own Node.
//
// Convert is the pure part: one Service and its EndpointSlices become one
// lb.Service per Service port, with kube-proxy's semantics (headless,
// ExternalName and other proxies' Services ignored; ready, serving and
// terminating conditions; Local traffic policies; topology hints; dual
// stack; ClientIP affinity; LoadBalancer ingress IPs with ipMode Proxy left
// to the load balancer). What is wrong with an object is reported as an
// *InvalidError, dropped at the smallest unit it spoils (an address, an
// endpoint, a port), and never affects another Service.
//
// Run is the live part: informer events mark Services dirty, and a loop
// writes the dirty ones into the Store with one Store.Update as they come,
// those arriving during a write together in the next (a full Store.Replace
// on the initial sync and after the watch recovers from an error); the
// sync runner, not the source, holds syncs to --min-sync-period. While the API server is unreachable the
// Store keeps the last state it was given. Each change is also handed to
// an optional ChangeTracker with when it was triggered (an EndpointSlice's
// endpoints.kubernetes.io/last-change-trigger-time, a new Service's
// creation) and the Store version that carries it, for kube-proxy's
// network programming latency; the Node's eligibility (not being deleted,
// not tainted ToBeDeletedByClusterAutoscaler) goes to the health tracker.
package kube
