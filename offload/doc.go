// Package offload is svcproxy's kernel boundary for moving an established
// TCP connection's bytes without user space: a BPF sockmap whose stream
// verdict program sends every byte one socket receives out of its peer
// (issue 16). The forwarder decides (accept, backend choice, retries,
// FIN, RST, timeouts, the connection log); the kernel copies.
//
// # Design
//
// Sockmap (sockmap_linux.go) owns one program and three maps, made with
// github.com/cilium/ebpf and its assembler, so neither building nor
// testing needs a C toolchain:
//
//   - socks, a SOCKHASH keyed by socket cookie (SO_COOKIE), the program
//     attached as its sk_skb stream verdict (BPF_PROG_ATTACH on the map);
//   - targets, a SOCKHASH of the same sockets with no program, where the
//     verdict redirects to;
//   - peers, a hash from cookie to {peer cookie, bytes}.
//
// The verdict: a zero-length skb (a bare FIN) is
// dropped; a socket with no peers entry gets SK_PASS (user space reads
// it); otherwise skb->len is added atomically to the socket's count and
// the skb goes to bpf_sk_redirect_hash(targets, peer, 0), the peer's
// egress.
//
// The forwarder (forwarder/offload_linux.go) inserts a pair once the
// backend is connected and the relay holds no bytes, removes it when the
// relay finishes, and reads the counts for the connection log, the bytes
// metric and idle detection. It asks New once at start: New is the
// capability probe (map creation, program load, attach); an error is
// logged and the forwarder runs without offload. A failed Insert leaves
// that connection on the user-space path (counted as
// svcproxy_forwarder_offloaded_connections_total{result="failed"}).
//
// # What the kernel taught
//
// Each of these was a failing test before it was a paragraph here:
//
//   - Bytes queued before insertion stay on the receive queue until the
//     next segment runs the verdict, which a client waiting for its answer
//     never sends. Insert sets SO_RCVLOWAT (to its default, 1): that runs
//     data_ready under the socket lock, now the verdict's, and the queue
//     goes through in order.
//   - tcp_read_skb hands the verdict every skb, a bare FIN's too. A
//     zero-length skb redirected to egress makes the peer's psock sender
//     (sk_psock_backlog) treat "sent 0 bytes" as a hard error: EPIPE on the
//     peer socket, and nothing more sent. The verdict drops them; TCP has
//     already taken the FIN in, and user space sees it as EPOLLRDHUP and a
//     read of 0.
//   - A redirect to a socket not (yet) in the target map drops the skb,
//     and TCP has acknowledged it: with one map, a backend answering while
//     the client socket was being inserted lost its answer (1 run in 4 of
//     200 concurrent echo connections stalled). Both sockets go into
//     targets before either goes into socks.
//   - Redirected bytes are sent by a kworker (the peer psock's backlog
//     work), after the verdict returns. A FIN passed on as soon as user
//     space reads EOF can overtake them; the forwarder waits until the
//     peer socket has had as many bytes written into it (TCP_INFO
//     bytes_acked + SIOCOUTQ, see Written) as the program counted.
//   - Closing a socket takes it out of both socket maps by itself; peers
//     entries are the forwarder's to delete (cookies are never reused).
//
// # Restart
//
// A draining predecessor keeps its Sockmap until its last connection
// ends (the engine closes it after its workers stop): its offloaded
// connections keep flowing through the drain, while the successor
// offloads new connections in a Sockmap of its own
// (TestPrivilegedOffloadHandover). At the drain timeout they are closed
// like any other connection. Offloaded sockets are not handed over: the
// predecessor's maps die with it, and the successor could not know the
// byte counts or the half-close state of a connection it never saw.
//
// # Measured
//
// See MEASURED below (filled in from the bench run).
package offload
