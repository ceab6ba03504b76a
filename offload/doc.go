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
// backend connection is 100 ms old, at its next bytes, when the relay
// holds none (a connection per request stays in user space: offloaded, its
// FIN came after its bytes by another path and its client closed first),
// removes it when the
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
// # Measured: it does not win; off by default
//
// The full bench (make bench-full, 2026-11-26 14:53 UTC, 3 interleaved
// rounds, medians; docs/bench/2026-11-26b-full/results.md), beside kube-dnat,
// svcproxy-userspace, HAProxy and nginx stream in the same run:
//
//	mode                 bulk 1 / 4 streams  keep-alive req/s  p99 ms  new conn/s  1 MiB/s  failed after a kill
//	kube-dnat            14.9 / 28.4 Gbit/s  70.0k             6.03    17.4k       3.02k    2,832
//	svcproxy-userspace   12.4 / 13.6         45.2k             3.42    9.81k       1.57k    0
//	svcproxy-sockmap      4.6 / 10.0         30.2k             5.40    6.24k       204      0
//	haproxy              11.9 / 12.2         41.8k             3.96    10.4k       1.98k    0
//	nginx-stream          6.4 / 10.5         52.7k             3.27    10.8k       1.32k    0
//
// Against issue 16's goals: keep-alive 0.43× kube-dnat's (goal ≥ 0.95×),
// bulk 0.31× (≥ 0.9×), new connections 0.64× svcproxy-userspace's (no
// worse), the fault test 0 failed after the kill (met: the decisions stay
// in user space). It loses to the event loop on every row; 1 MiB transfers
// fall to 0.13× (a stream of large responses is where the kworker hand-off
// and the jiffy retry below cost most).
//
// The first, shorter run (go run ./bench --modes
// kube-dnat,svcproxy-userspace,svcproxy-sockmap --tests
// keepalive,bulk1,connrate --rounds 2 --perf), 2026-11-26, a 2-core AMD
// EPYC VM, kernel 6.18 (HZ=250), medians of 2 rounds; the machine's load
// rose from 0.56 to 3.9 during it (the bench's own load and other work),
// and rounds disagreed by up to 37% (svcproxy-sockmap's new conn/s far
// more):
//
//	mode                 bulk 1 stream  keep-alive req/s  p50 / p99 ms   new conn/s  CPU µs/req¹
//	kube-dnat            11.9 Gbit/s    48.8k             1.10 / 12.67   13.5k       –
//	svcproxy-userspace    9.4 Gbit/s    33.8k             1.71 / 10.94   8.01k       19.8
//	svcproxy-sockmap      4.9 Gbit/s    25.6k             2.30 / 14.74   3.19k²      9.1
//
//	¹ of the svcproxy process only: the offloaded bytes are moved by
//	  kworkers, which no process is charged for.
//	² 460 and 5.9k conn/s in its two rounds.
//
// Against issue 16's targets: keep-alive 0.52× kube-dnat (target ≥ 0.95×),
// bulk 0.41× (≥ 0.9×), new connections 0.40× svcproxy-userspace (no
// worse). The forwarder's own benchmarks, same machine, other work
// running (go test -bench 'Throughput|Request|Connect', event loop without
// and with the offload): 1581 vs 1193 MB/s bulk, 34.4 vs 44.1 µs per
// keep-alive round trip, 253 vs 315 µs per new connection.
//
// # Where the time goes
//
// A system-wide perf profile of the keep-alive benchmark with offload
// (perf record -a -g) puts 29% of both CPUs in kworkers:
// sk_psock_backlog → __skb_send_sock → sock_sendmsg → tcp_sendmsg, the
// TCP work of the peer's egress (on loopback the receiver's
// tcp_v4_do_rcv runs inline in it), and 9% of them in schedule. The
// offload does not take work away, it moves it:
//
//   - Redirect to a peer's egress has no fast path. The verdict runs in
//     softirq, queues the skb on the peer's psock and schedules its work
//     item; a kworker wakes and sends it with the same tcp_sendmsg the
//     forwarder's write(2) or splice(2) would have run. Per message, the
//     event loop's epoll wakeup and two system calls become a workqueue
//     wakeup and a context switch to a kworker: no cheaper, and the
//     kworker's scheduling adds latency (p50 1.71 → 2.30 ms).
//   - Bulk streams stall on a jiffy. When the peer's send buffer is full,
//     skb_send_sock returns EAGAIN and sk_psock_backlog re-arms itself
//     with schedule_delayed_work(work, 1): 4 ms at HZ=250, a pause each
//     time the sink falls behind. In the bulk profile the kworkers use
//     11% of the CPUs and 12% is idle while the stream runs at half the
//     event loop's rate; the forwarder's splice instead waits for
//     EPOLLOUT, which comes as soon as there is room.
//   - Every connection pays for the maps: two SO_COOKIE reads, six map
//     updates (each socket into two SOCKHASHes, which also swaps its
//     sk_prot), two SO_RCVLOWAT kicks and four TCP_INFO/SIOCOUTQ reads to
//     insert; two lookups and six deletes to remove; and on a FIN, two
//     lookups and two socket reads per check, polled again from 100 µs
//     on when the kworker has not yet sent the last bytes (5% of short
//     connections in a sequential test). About 30 system calls a connection on top
//     of the event loop's, for connections that mostly carry one request.
//
// So the event loop, which already moves bulk with splice and answers
// small messages with one read and one write per wakeup, is the faster
// data path here, and --offload stays none by default. It may pay where
// this bench does not look: few long-lived connections carrying many
// small messages on a busy host, where saving the proxy's system calls
// and its Go scheduling matters more than the kworker hop (the proxy's
// own CPU per keep-alive request halves, 19.8 → 9.1 µs, though the total
// does not). Whoever tries it there should measure total CPU
// (kworkers included), not svcproxy's.
package offload
