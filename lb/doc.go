// Package lb owns svcproxy's load-balancer state and policy: the Services and
// endpoints every proxy mode serves, the one policy that decides which
// endpoints are usable (ready first, then serving and terminating; traffic
// policies; topology), the pickers that choose one endpoint for a new
// connection (round robin, random, least connections, Maglev, ClientIP
// affinity), and passive health (cool-down of backends that refused or timed
// out).
//
// Sources (a static file, Kubernetes) write Services into a Store; the Store
// publishes an immutable, versioned *Snapshot with an atomic pointer swap, so
// readers on the hot path never take a lock. Every mode consumes the same
// Snapshot and only translates it: no mode decides policy again. The
// Snapshot also says which frontends each Service port owns after conflicts
// (Frontends, NodePort) and what changed since a previous one (Changed), so
// no mode recomputes ownership or keeps its own change tracking. Each
// Service port has a pool for internal and one for external traffic, and,
// under externalTrafficPolicy Local, a third for the external traffic of
// clients inside the cluster (Balancer.ShortCircuit); which clients are
// inside is the modes' to tell, from the source address.
//
// lb is pure: it knows nothing of client-go, sockets, iptables or IPVS.
// The only mutable state reachable from a Snapshot is runtime bookkeeping kept
// in atomics (connection counts, health, round-robin cursors, affinity), which
// lives across snapshots so a Service update does not reset it.
package lb
