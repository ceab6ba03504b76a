// Package netfiltertest is an in-memory netfilter for tests: Fake, a
// netfilter.Executor that keeps the nat and filter tables of both families
// and the ipsets, parses exactly the input the real tools get and refuses
// what they refuse, and a packet tracer (Fake.Trace, Fake.TraceAll,
// Fake.TraceChain) that follows the first packet of a connection through
// those tables as the kernel would.
//
// The Fake models the subset of the rule language svcproxy writes: -s, -d,
// -p with --dport; the mark, addrtype (--dst-type), conntrack (--ctstate),
// set (hash:ip, hash:ip,port, hash:ip,port,ip, hash:net, bitmap:port),
// recent and statistic (--mode random) matches; and the RETURN, ACCEPT,
// DROP, REJECT, REDIRECT, DNAT, MASQUERADE and MARK targets. Anything else
// is kept verbatim: it round-trips and can be deleted, but never matches a
// traced packet. It refuses what the real tools refuse for that subset (a
// jump to a missing chain, a rule naming a missing set, DNAT reachable from
// POSTROUTING, a port without -p, ...); TestPrivilegedFakeParity runs the
// same table against the real tools of both backends.
//
// # The tracer
//
// Fake.Trace answers "where does the first packet of a connection from A to
// VIP:port go?": nat PREROUTING or OUTPUT (REDIRECT, DNAT, MARK), then the
// filter chains the routing decision leads to (INPUT, FORWARD, OUTPUT), then
// nat POSTROUTING (MASQUERADE) for packets that leave through an interface.
// -m statistic draws from a seeded source and -m recent lists remember
// sources at the Fake's clock (Advance), so affinity can be tested with
// repeated traces. Fake.TraceAll follows every -m statistic branch instead
// and returns each outcome with its probability, without touching -m recent
// state: "traffic spreads evenly over exactly these endpoints" is one
// comparison.
package netfiltertest
