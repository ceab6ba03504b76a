package ipvstest

import (
	"net/netip"
	"slices"
	"strconv"
	"sync"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
)

// Packet is the first packet of a connection or UDP flow, for Trace.
type Packet struct {
	Src, Dst netip.AddrPort
	Proto    lb.Protocol
	// Local: sent by a process on the node (nat OUTPUT, IPVS LOCAL_OUT).
	// Otherwise it arrives from a pod or another host (PREROUTING).
	Local bool
}

// Action is what happens to a traced packet.
type Action uint8

// The outcomes.
const (
	Untouched Action = iota // continues to its destination unchanged: no virtual server took it
	Forwarded               // IPVS sent it to a real server
	Rejected                // refused at once (TCP reset / ICMP port unreachable)
	Dropped                 // dropped
)

var actionNames = [...]string{Untouched: "Untouched", Forwarded: "Forwarded", Rejected: "Rejected", Dropped: "Dropped"}

func (a Action) String() string {
	if int(a) < len(actionNames) {
		return actionNames[a]
	}
	return "Action(" + strconv.Itoa(int(a)) + ")"
}

// Verdict is where a traced packet goes.
type Verdict struct {
	Action  Action
	Backend netip.AddrPort // Forwarded: the real server
	// Masquerade: the packet leaves for the real server with the node's
	// address as its source.
	Masquerade bool
	// VirtualServer that took it, as "tcp/198.19.0.10:80".
	VirtualServer string
	// Rule that decided a rejection or drop ("-A CHAIN spec", or what
	// IPVS did).
	Rule string
}

func (v Verdict) String() string {
	switch v.Action {
	case Forwarded:
		s := "Forwarded to " + v.Backend.String()
		if v.Masquerade {
			s += " (masqueraded)"
		}
		return s
	case Rejected, Dropped:
		return v.Action.String() + " by " + v.Rule
	}
	return v.Action.String()
}

// Trace follows p the way the kernel would through the rules and IPVS, as
// the first packet of a new connection (so it moves round-robin cursors and
// persistence templates as a real connection would, but counts no
// connection: see Connect). From a pod (PREROUTING): nat PREROUTING, then
// for a local destination (a VIP on the dummy, a node IP) filter INPUT and
// IPVS; otherwise it is forwarded untouched. From the node (OUTPUT): nat
// OUTPUT, IPVS (any destination), filter OUTPUT (and INPUT for a local
// destination). A packet IPVS sends on goes through filter OUTPUT and nat
// POSTROUTING, which decides masquerading. The chains are walked by the
// Rules' own tracer (netfiltertest.Fake.TraceChain), the mark nat set carried
// from one to the next.
func (f *Fakes) Trace(p Packet) Verdict { return f.trace(p, false) }

// Conn is a connection Connect opened; Close ends it.
type Conn struct {
	f     *Fakes
	proto lb.Protocol
	once  sync.Once
	Route Verdict
}

// Connect traces p and, when it is forwarded, counts an active connection
// on the real server (for TCP and SCTP) or a conntrack flow (for UDP: later
// datagrams of the flow follow it, until it is cleared).
func (f *Fakes) Connect(p Packet) *Conn {
	return &Conn{f: f, proto: p.Proto, Route: f.trace(p, true)}
}

// Close ends a connection Connect opened.
func (c *Conn) Close() {
	c.once.Do(func() {
		if c.Route.Action != Forwarded || c.proto == lb.UDP {
			return
		}
		ip := c.f.IPVS
		ip.mu.Lock()
		defer ip.mu.Unlock()
		if vs := ip.services[c.Route.VirtualServer]; vs != nil {
			for _, d := range vs.dests {
				if d.addr == c.Route.Backend && d.active > 0 {
					d.active--
				}
			}
		}
	})
}

// chain walks one chain of the Rules for p, carrying its mark; a verdict
// is returned when a rule rejected or dropped it.
func (f *Fakes) chain(p *netfiltertest.Packet, table, name string) (Verdict, bool) {
	v, mark, decided := f.Rules.TraceChain(*p, table, name)
	p.Mark = mark
	switch {
	case decided && v.Action == netfiltertest.Drop:
		return Verdict{Action: Dropped, Rule: v.Rule}, true
	case decided && v.Action == netfiltertest.Reject:
		return Verdict{Action: Rejected, Rule: v.Rule}, true
	}
	return Verdict{}, false
}

func (f *Fakes) trace(p Packet, open bool) Verdict {
	// Lock order: IPVS, Links, Conntrack, then the Rules' own.
	f.IPVS.mu.Lock()
	defer f.IPVS.mu.Unlock()
	f.Links.mu.Lock()
	defer f.Links.mu.Unlock()
	f.Conntrack.mu.Lock()
	defer f.Conntrack.mu.Unlock()

	unmap := func(a netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()) }
	t := netfiltertest.Packet{Src: unmap(p.Src), Dst: unmap(p.Dst), Proto: p.Proto, LocalAddrs: f.Links.local()}
	nat := "PREROUTING"
	if p.Local {
		t.Hook, nat = netfiltertest.Output, "OUTPUT"
	}
	if v, ok := f.chain(&t, "nat", nat); ok {
		return v
	}
	local := t.Dst.Addr().IsLoopback() || slices.Contains(t.LocalAddrs, t.Dst.Addr())
	k := vsName(p.Proto, t.Dst)
	if !p.Local {
		if !local {
			return Verdict{Action: Untouched}
		}
		if v, ok := f.chain(&t, "filter", "INPUT"); ok {
			return v
		}
	}
	// A UDP datagram of a flow conntrack knows follows it: to its real
	// server if that is still there, else nowhere (expire_nodest_conn).
	if p.Proto == lb.UDP {
		if b, ok := f.Conntrack.flows[udpFlow{t.Src, t.Dst}]; ok {
			vs := f.IPVS.services[k]
			if vs == nil || !slices.ContainsFunc(vs.dests, func(d *realServer) bool { return d.addr == b }) {
				return Verdict{Action: Dropped, Rule: "IPVS: stale UDP flow to removed real server " + b.String()}
			}
			return f.postrouting(t, k, b)
		}
	}
	dest, found, ok := f.IPVS.schedule(k, t.Src.Addr())
	switch {
	case ok && !found:
		return Verdict{Action: Rejected, VirtualServer: k, Rule: "IPVS " + k + ": no real server of weight > 0 (ICMP port unreachable)"}
	case ok:
		if open {
			if p.Proto == lb.UDP {
				if f.Conntrack.flows == nil {
					f.Conntrack.flows = map[udpFlow]netip.AddrPort{}
				}
				f.Conntrack.flows[udpFlow{t.Src, t.Dst}] = dest.addr
			} else {
				dest.active++
			}
		}
		return f.postrouting(t, k, dest.addr)
	}
	if p.Local {
		if v, ok := f.chain(&t, "filter", "OUTPUT"); ok {
			return v
		}
		if local {
			if v, ok := f.chain(&t, "filter", "INPUT"); ok {
				return v
			}
		}
	}
	return Verdict{Action: Untouched}
}

// postrouting sends t, IPVS-NATed to backend, through filter OUTPUT and nat
// POSTROUTING (IPVS with conntrack=1 re-enters the output path).
func (f *Fakes) postrouting(t netfiltertest.Packet, k string, backend netip.AddrPort) Verdict {
	t.Dst = backend
	if v, ok := f.chain(&t, "filter", "OUTPUT"); ok {
		v.VirtualServer = k
		return v
	}
	v := Verdict{Action: Forwarded, Backend: backend, VirtualServer: k}
	if nv, _, _ := f.Rules.TraceChain(t, "nat", "POSTROUTING"); nv.Masquerade {
		v.Masquerade = true
	}
	return v
}
