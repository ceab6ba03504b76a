// Package forwarder owns svcproxy's userspace data path: the listening
// sockets, and for every accepted connection the choice of backend (through
// the lb.Snapshot it was last given), the dial with retry on refusal, the
// zero-copy byte pump between client and backend, idle timeouts, draining of
// removed backends and graceful shutdown.
//
// # How a connection finds its Service
//
// A forwarder listens on two kinds of address, each with Workers sockets
// sharing the port through SO_REUSEPORT (one accept loop per socket, so
// accepts spread over cores without a shared lock):
//
//   - Redirect listeners (Config.Redirect): one port per address family that
//     iptables REDIRECT sends every steered Service connection to. The
//     Service is found from the connection's original destination, read with
//     getsockopt(SO_ORIGINAL_DST) from conntrack. 10,000 Services cost
//     Workers sockets, not 10,000 × Workers, and adding a Service opens
//     nothing: it is one more entry in the snapshot's frontend map.
//   - Frontend listeners (Config.BindFrontends): one socket group per Service
//     frontend (ClusterIP, ExternalIP or LoadBalancer IP and port, and
//     NodePorts on every address), routed by the accepted socket's local
//     address. This is for running without steering rules (a static services
//     file on loopback) and for small Service counts only.
//
// A connection whose destination is no Service's frontend is reset: the
// forwarder never connects anywhere but to an endpoint of the Service the
// client addressed, so it is not an open relay.
//
// # The hot path
//
// Both sides stay raw TCP sockets. Bulk streams move with splice(2) through
// a pipe, never through user space; small messages with read/write through
// a pooled buffer; a direction switches between the two as its chunks grow
// and shrink, and pipes and buffers are borrowed only while bytes are in
// flight, so idle connections hold neither (see splice_linux.go).
// Idle detection is one read deadline per direction, moved only when it
// passes. The per-connection state comes from a sync.Pool; metrics children
// are resolved once; the connection log takes a copy of a fixed-size record.
package forwarder
