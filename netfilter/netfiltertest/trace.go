package netfiltertest

import "github.com/svcproxy/svcproxy/netfilter/internal/model"

// Hook is where a traced packet enters the stack.
type Hook = model.Hook

// The hooks: Prerouting for packets arriving from pods or other hosts,
// Output for packets the node itself sends.
const (
	Prerouting = model.Prerouting
	Output     = model.Output
)

// Packet is the first packet of a connection or flow, for Trace.
type Packet = model.Packet

// Action is what happens to a traced packet.
type Action = model.Action

// The outcomes.
const (
	Accept   = model.Accept   // continues with its destination unchanged
	Redirect = model.Redirect // redirected to a local port
	Reject   = model.Reject   // refused (TCP reset / ICMP port unreachable)
	Drop     = model.Drop     // dropped
	DNAT     = model.DNAT     // continues to the destination nat translated it to
)

// Verdict is where a traced packet goes.
type Verdict = model.Verdict

// Outcome is one of the places a packet may go, with its probability.
type Outcome = model.Outcome

// Trace follows p through the nat and filter tables the way the kernel
// would, for the matches and targets svcproxy writes (foreign rules with
// other matches never match): nat PREROUTING or OUTPUT first (REDIRECT,
// DNAT, MARK); then filter OUTPUT (and INPUT for a local destination) for a
// locally sent packet, or filter INPUT (local destination) or FORWARD for an
// arriving one; then nat POSTROUTING (MASQUERADE) for a packet that leaves
// through an interface. It takes one path: -m statistic draws from the
// Fake's seeded random source (Seed), and -m recent --set records the source
// at the Fake's clock (Advance), as a connection through the kernel would.
func (f *Fake) Trace(p Packet) Verdict {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.k.Trace(p)
}

// TraceAll follows p through every path -m statistic allows and returns each
// distinct outcome with its probability (they sum to 1), sorted by action
// then destination. It changes nothing: -m recent lists are read, not
// written. Tests assert "spread evenly over exactly these endpoints" with it.
func (f *Fake) TraceAll(p Packet) []Outcome {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.k.TraceAll(p)
}

// TraceChain walks one chain of p's family for p, as Trace does at that
// point of the path, for a tracer that puts something of its own between
// the hooks (the IPVS mode's: IPVS takes packets after filter INPUT or nat
// OUTPUT). It returns the verdict of the rule that decided (decided is
// false when the chain ran out or RETURNed) and p's mark after the MARK
// rules it passed, to carry into the next chain. -m statistic and -m recent
// behave as in Trace.
func (f *Fake) TraceChain(p Packet, tableName, chainName string) (v Verdict, mark uint32, decided bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.k.TraceChain(p, tableName, chainName)
}
