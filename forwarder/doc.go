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
//     steering (package redirect: a REDIRECT, or a DNAT to a node address)
//     sends every steered Service connection to. The
//     Service is found from the connection's original destination, read with
//     getsockopt(SO_ORIGINAL_DST) from conntrack. 10,000 Services cost
//     Workers sockets, not 10,000 × Workers, and adding a Service opens
//     nothing: it is one more entry in the snapshot's frontend map.
//   - Frontend listeners (Config.BindFrontends): one socket group per Service
//     frontend (ClusterIP, ExternalIP or LoadBalancer IP and port, and
//     NodePorts on every address), routed by the accepted socket's local
//     address. This is for running without steering rules: a static
//     services file on loopback, or local steering (package userspace),
//     which makes every virtual IP an address of the node. It costs
//     Workers sockets per frontend: 20,000 descriptors and a 2 s first
//     sync at 10,000 Services with 2 workers.
//
// A client inside the cluster (Config.Inside: a pod, or the node) that
// reaches an external frontend of a Service with externalTrafficPolicy
// Local is routed to the Service's short circuit (lb.Pool.ShortCircuit),
// its endpoints on every node, as kube-proxy does; other clients there get
// this node's endpoints alone.
//
// A connection whose destination is no Service's frontend is reset: the
// forwarder never connects anywhere but to an endpoint of the Service the
// client addressed, so it is not an open relay.
//
// SCTP Service ports are not served: Go has no SCTP sockets (and many
// kernels none either). Apply warns once per SCTP Service port ("SCTP is
// served by the kernel modes only") and opens nothing for it; redirect
// steering leaves SCTP frontends alone.
//
// # The hot path
//
// On Linux the TCP data path is an event loop per worker (loop_linux.go):
// each worker owns an epoll instance, one SO_REUSEPORT socket of every
// listening address and every connection accepted there, and drives each
// connection through a state machine (relay_linux.go) with no goroutine,
// lock or timer of its own. Both sides stay raw non-blocking sockets,
// registered edge-triggered with EPOLLRDHUP; dials are non-blocking
// connects completed by EPOLLOUT in the same loop; dial, idle and drain
// deadlines live in the worker's timer heap, which sets the loop's wait.
// Small messages pass through the worker's one read buffer; bulk streams
// move with splice(2) through a pipe borrowed while bytes are in it; a
// sink that cannot keep up holds its source unread until it drains. Where
// the proxy knows what comes next it saves a segment: the first bytes of a
// client that speaks first ride with the backend handshake's last ACK, and
// a source's last bytes leave with the FIN that follows them; a spliced
// source that runs dry sends the ACK the kernel held back at once, not
// 20–40 ms later from the delayed-ACK timer. Where
// the kernel allows io_uring (Config.IOUring), the small messages of every
// connection one harvest found ready are read with one io_uring_enter and
// written with another (batch_linux.go). Idle connections hold no buffer,
// no pipe and no goroutine stack. UDP
// frontends and their flows' sockets are spread over the same workers
// (udp_loop_linux.go): recvmmsg from the frontend, a write per query, and
// the replies of every flow the harvest found ready sent with one
// sendmmsg.
//
// Elsewhere, and on Linux with Config.Engine = EngineGoroutines, each
// connection has a goroutine that dials and two that copy through Go's
// poller (conn.go, splice_linux.go), and UDP a reader per frontend and
// per flow (udp.go): the same behaviour, slower, and run by the same
// tests (make test runs the package on both engines).
//
// With Config.Offload = OffloadSockmap (--offload=sockmap) the sockets of a
// connection 100 ms old or more go into a BPF sockmap (package offload) and
// the kernel moves its bytes; the relay keeps its state machine for FIN,
// RST, timeouts and the log (offload_linux.go). It is off by default: measured
// slower than the event loop (see package offload).
//
// The connection log takes a copy of a fixed-size record; metrics children
// are resolved once.
//
// # Other systems
//
// On Windows and macOS/BSD the forwarder builds with the goroutine engine
// only (Config.Engine = EngineEventLoop is refused) and serves frontend
// listeners (Config.BindFrontends): the userspace mode without steering.
// What it gives up, each failing or warning by name rather than quietly:
//
//   - Redirect listeners and NodePort claims need SO_ORIGINAL_DST and
//     steering rules: New fails with errors.ErrUnsupported.
//   - No SO_REUSEPORT that spreads connections: each address has one
//     listening socket whatever Workers says; its accept loop hands each
//     connection to a goroutine, so they still spread over cores.
//   - No SO_MARK: a Mark of zero means none, and a positive one is logged
//     as unsupported and dropped (there are no rules for it to bypass).
//   - No splice(2): each chunk is read into a pooled 64 KiB buffer and
//     written out (splice_other.go). A direction waits for its source to
//     be readable before it borrows one (a zero-byte overlapped read on
//     Windows, a MSG_PEEK on Unix), so idle connections still hold none.
//   - UDP reads and writes one datagram a call. On Windows x/net has no
//     control messages, so the address a client wrote to is unknown: a
//     UDP frontend on the unspecified address (a NodePort) fails to open
//     with errors.ErrUnsupported, and Go disables ICMP port-unreachable
//     reports there, so a flow to a dead UDP backend lasts until
//     UDPIdleTimeout instead of ending at once.
//   - Windows errors (WSAECONNREFUSED, WSAECONNRESET, WSAEMFILE,
//     WSAENOBUFS, ...) are mapped for retry on refusal and accept backoff;
//     there is no spare descriptor to refuse queued clients with when out
//     of handles (spare_unix.go), so accept only backs off; leak checks in the tests count goroutines only (no /proc/self/fd).
//
// Only Linux runs the tests; internal/hygiene checks that the package and
// its tests build for windows and darwin.
package forwarder
