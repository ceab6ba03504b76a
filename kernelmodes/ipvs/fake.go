package ipvs

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// Fakes is an in-memory kernel for tests: one fake per boundary, and a
// packet tracer over them all. Plug it in with Config.
type Fakes struct {
	IPVS      *FakeIPVS
	Links     *FakeLinks
	Rules     *FakeRules
	Conntrack *FakeConntrack
	Sysctls   *FakeSysctls
}

// NewFakes returns an empty kernel (loopback only) on clock now (nil:
// time.Now).
func NewFakes(now func() time.Time) *Fakes {
	return &Fakes{
		IPVS:      NewFakeIPVS(now),
		Links:     NewFakeLinks(),
		Rules:     NewFakeRules(),
		Conntrack: &FakeConntrack{},
		Sysctls:   NewFakeSysctls(),
	}
}

// Config returns cfg with the fakes as every kernel boundary cfg leaves
// nil (so a test can mix a real boundary with fakes).
func (f *Fakes) Config(cfg Config) Config {
	if cfg.IPVS == nil {
		cfg.IPVS = f.IPVS
	}
	if cfg.Links == nil {
		cfg.Links = f.Links
	}
	if cfg.Rules == nil {
		cfg.Rules = f.Rules
	}
	if cfg.Conntrack == nil {
		cfg.Conntrack = f.Conntrack
	}
	if cfg.Sysctls == nil {
		cfg.Sysctls = f.Sysctls
	}
	return cfg
}

// Calls returns every call any fake received since the last ResetCalls.
func (f *Fakes) Calls() []string {
	return slices.Concat(f.IPVS.Calls(), f.Links.Calls(), f.Rules.Calls(), f.Conntrack.Calls(), f.Sysctls.Calls())
}

// ResetCalls forgets every fake's calls.
func (f *Fakes) ResetCalls() {
	f.IPVS.ResetCalls()
	f.Links.ResetCalls()
	f.Rules.ResetCalls()
	f.Conntrack.ResetCalls()
	f.Sysctls.ResetCalls()
}

// --- Links ---

// FakeLinks is an in-memory Links: interfaces with addresses. It starts
// with lo (127.0.0.1, ::1); AddNodeAddr adds the node's own addresses.
type FakeLinks struct {
	mu      sync.Mutex
	links   map[string]*fakeLink
	calls   []string
	failing map[string]error
}

type fakeLink struct {
	kind  string
	addrs []netip.Addr
}

// NewFakeLinks returns a FakeLinks holding lo.
func NewFakeLinks() *FakeLinks {
	return &FakeLinks{
		links:   map[string]*fakeLink{"lo": {kind: "loopback", addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}}},
		failing: map[string]error{},
	}
}

var _ Links = (*FakeLinks)(nil)

// AddNodeAddr puts addr on interface name (an Ethernet-like one, created
// when missing), as the node's own address.
func (f *FakeLinks) AddNodeAddr(name string, addr netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.links[name]
	if l == nil {
		l = &fakeLink{kind: "veth"}
		f.links[name] = l
	}
	if !slices.Contains(l.addrs, addr) {
		l.addrs = append(l.addrs, addr)
	}
}

// Link returns the kind and addresses of an interface; ok is false when it
// does not exist.
func (f *FakeLinks) Link(name string) (kind string, addrs []netip.Addr, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.links[name]
	if l == nil {
		return "", nil, false
	}
	return l.kind, slices.Clone(l.addrs), true
}

// FailNext makes the next call of op (a method name) fail with err.
func (f *FakeLinks) FailNext(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failing[op] = err
}

// Calls returns the calls so far.
func (f *FakeLinks) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// ResetCalls forgets the calls so far.
func (f *FakeLinks) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = nil
}

func (f *FakeLinks) record(op string, args ...any) error {
	c := op
	for _, a := range args {
		c += fmt.Sprint(" ", a)
	}
	f.calls = append(f.calls, c)
	if err := f.failing[op]; err != nil {
		delete(f.failing, op)
		return fmt.Errorf("fake %s: %w", op, err)
	}
	return nil
}

// EnsureDummy implements Links.
func (f *FakeLinks) EnsureDummy(ctx context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("EnsureDummy", name); err != nil {
		return err
	}
	if l := f.links[name]; l != nil {
		if l.kind != "dummy" {
			return fmt.Errorf("interface %s exists and is a %s, not a dummy", name, l.kind)
		}
		return nil
	}
	f.links[name] = &fakeLink{kind: "dummy"}
	return nil
}

// DeleteLink implements Links.
func (f *FakeLinks) DeleteLink(ctx context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("DeleteLink", name); err != nil {
		return err
	}
	delete(f.links, name)
	return nil
}

// Addrs implements Links.
func (f *FakeLinks) Addrs(ctx context.Context, name string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("Addrs", name); err != nil {
		return nil, err
	}
	l := f.links[name]
	if l == nil {
		return nil, fmt.Errorf("%s: %w", name, ErrNoLink)
	}
	return slices.Clone(l.addrs), nil
}

// AddAddr implements Links.
func (f *FakeLinks) AddAddr(ctx context.Context, name string, addr netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("AddAddr", name, addr); err != nil {
		return err
	}
	l := f.links[name]
	if l == nil {
		return fmt.Errorf("%s: %w", name, ErrNoLink)
	}
	if !slices.Contains(l.addrs, addr) {
		l.addrs = append(l.addrs, addr)
	}
	return nil
}

// DelAddr implements Links.
func (f *FakeLinks) DelAddr(ctx context.Context, name string, addr netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("DelAddr", name, addr); err != nil {
		return err
	}
	l := f.links[name]
	if l == nil {
		return fmt.Errorf("%s: %w", name, ErrNoLink)
	}
	l.addrs = slices.DeleteFunc(l.addrs, func(a netip.Addr) bool { return a == addr })
	return nil
}

// NodeAddrs implements Links.
func (f *FakeLinks) NodeAddrs(ctx context.Context, exclude string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("NodeAddrs", exclude); err != nil {
		return nil, err
	}
	var out []netip.Addr
	for name, l := range f.links {
		if name == exclude || l.kind == "loopback" {
			continue
		}
		for _, a := range l.addrs {
			if a.IsGlobalUnicast() && !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// local reports whether a is an address of any interface (a down dummy's
// included: the kernel still routes them locally). Callers hold f.mu.
func (f *FakeLinks) local(a netip.Addr) bool {
	if a.IsLoopback() {
		return true
	}
	for _, l := range f.links {
		if slices.Contains(l.addrs, a) {
			return true
		}
	}
	return false
}

// --- Conntrack and sysctls ---

// FakeConntrack is an in-memory Conntrack holding the UDP flows
// Fakes.Connect opened; ClearUDP deletes them.
type FakeConntrack struct {
	mu    sync.Mutex
	flows map[udpFlowKey]netip.AddrPort // client, vip:port -> backend
	calls []string
}

type udpFlowKey struct {
	client, vip netip.AddrPort
}

var _ Conntrack = (*FakeConntrack)(nil)

// ClearUDP implements Conntrack.
func (f *FakeConntrack) ClearUDP(ctx context.Context, vip netip.Addr, port uint16, backend netip.AddrPort) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("ClearUDP %v %v", netip.AddrPortFrom(vip, port), backend))
	for k, b := range f.flows {
		if k.vip == netip.AddrPortFrom(vip, port) && b == backend {
			delete(f.flows, k)
		}
	}
	return nil
}

// Flows returns the UDP flows as "client -> vip:port -> backend", sorted.
func (f *FakeConntrack) Flows() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for k, b := range f.flows {
		out = append(out, fmt.Sprintf("%v -> %v -> %v", k.client, k.vip, b))
	}
	slices.Sort(out)
	return out
}

// Calls returns the calls so far.
func (f *FakeConntrack) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// ResetCalls forgets the calls so far.
func (f *FakeConntrack) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = nil
}

// FakeSysctls is an in-memory Sysctls; the IPVS ones start at the kernel's
// defaults (0).
type FakeSysctls struct {
	mu     sync.Mutex
	values map[string]string
	calls  []string
}

// NewFakeSysctls returns the kernel's defaults of the IPVS sysctls.
func NewFakeSysctls() *FakeSysctls {
	v := map[string]string{}
	for _, s := range sysctls {
		v[s[0]] = "0"
	}
	return &FakeSysctls{values: v}
}

var _ Sysctls = (*FakeSysctls)(nil)

// Sysctl implements Sysctls.
func (f *FakeSysctls) Sysctl(name string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "Sysctl "+name)
	v, ok := f.values[name]
	if !ok {
		return "", fmt.Errorf("no sysctl %s", name)
	}
	return v, nil
}

// SetSysctl implements Sysctls.
func (f *FakeSysctls) SetSysctl(name, value string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "SetSysctl "+name+"="+value)
	f.values[name] = value
	return nil
}

// Values returns every sysctl.
func (f *FakeSysctls) Values() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.values)
}

// Calls returns the calls so far.
func (f *FakeSysctls) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// ResetCalls forgets the calls so far.
func (f *FakeSysctls) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = nil
}

// --- the tracer ---

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

func (a Action) String() string {
	switch a {
	case Untouched:
		return "Untouched"
	case Forwarded:
		return "Forwarded"
	case Rejected:
		return "Rejected"
	case Dropped:
		return "Dropped"
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

// tracedPacket is a packet as the tables see it at one point.
type tracedPacket struct {
	src, dst netip.AddrPort
	proto    string
	mark     uint32
	isLocal  func(netip.Addr) bool
}

// Trace follows p the way the kernel would through svcproxy's rules and
// IPVS, as the first packet of a new connection (so it moves round-robin
// cursors and persistence templates as a real connection would, but counts
// no connection: see Connect). From a pod (PREROUTING): nat PREROUTING,
// then for a local destination (a VIP on the dummy, a node IP) filter INPUT
// and IPVS; otherwise it is forwarded untouched. From the node (OUTPUT):
// nat OUTPUT, IPVS (any destination), filter OUTPUT (and INPUT for a local
// destination). A packet IPVS sends on goes through nat POSTROUTING, which
// decides masquerading.
func (f *Fakes) Trace(p Packet) Verdict {
	v, _ := f.trace(p, false)
	return v
}

// FakeConn is a connection Connect opened; Close ends it.
type FakeConn struct {
	f     *Fakes
	k     vsKey
	dest  netip.AddrPort
	once  sync.Once
	Route Verdict
}

// Connect traces p and, when it is forwarded, counts an active connection
// on the real server (for TCP) or a conntrack flow (for UDP: later
// datagrams of the flow follow it, until it is cleared).
func (f *Fakes) Connect(p Packet) *FakeConn {
	v, k := f.trace(p, true)
	return &FakeConn{f: f, k: k, dest: v.Backend, Route: v}
}

// Close ends a connection Connect opened.
func (c *FakeConn) Close() {
	c.once.Do(func() {
		if c.Route.Action != Forwarded || c.k.proto == lb.UDP {
			return
		}
		ip := c.f.IPVS
		ip.mu.Lock()
		defer ip.mu.Unlock()
		if vs := ip.services[c.k]; vs != nil {
			for _, d := range vs.dests {
				if d.addr == c.dest && d.active > 0 {
					d.active--
				}
			}
		}
	})
}

func (f *Fakes) trace(p Packet, open bool) (Verdict, vsKey) {
	// Lock order: Rules, IPVS, Links, Conntrack.
	f.Rules.mu.Lock()
	defer f.Rules.mu.Unlock()
	f.IPVS.mu.Lock()
	defer f.IPVS.mu.Unlock()
	f.Links.mu.Lock()
	defer f.Links.mu.Unlock()
	f.Conntrack.mu.Lock()
	defer f.Conntrack.mu.Unlock()

	unmap := func(a netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()) }
	t := &tracedPacket{src: unmap(p.Src), dst: unmap(p.Dst), proto: netfilter.ProtoName(p.Proto), isLocal: f.Links.local}
	fam := familyOf(t.dst.Addr())
	var rule string
	decided := func(v verdict) (Verdict, bool) {
		switch v {
		case vDrop:
			return Verdict{Action: Dropped, Rule: rule}, true
		case vReject:
			return Verdict{Action: Rejected, Rule: rule}, true
		}
		return Verdict{}, false
	}
	nat := "PREROUTING"
	if p.Local {
		nat = "OUTPUT"
	}
	if v, ok := decided(f.Rules.walk(fam, "nat", nat, t, &rule, 0)); ok {
		return v, vsKey{}
	}
	local := f.Links.local(t.dst.Addr())
	k := vsKey{p.Proto, t.dst}
	if !p.Local {
		if !local {
			return Verdict{Action: Untouched}, k
		}
		if v, ok := decided(f.Rules.walk(fam, "filter", "INPUT", t, &rule, 0)); ok {
			return v, k
		}
	}
	// A UDP datagram of a flow conntrack knows follows it: to its real
	// server if that is still there, else nowhere (expire_nodest_conn).
	if p.Proto == lb.UDP {
		if b, ok := f.Conntrack.flows[udpFlowKey{t.src, t.dst}]; ok {
			vs := f.IPVS.services[k]
			if vs == nil || !slices.ContainsFunc(vs.dests, func(d *fakeDest) bool { return d.addr == b }) {
				return Verdict{Action: Dropped, Rule: "IPVS: stale UDP flow to removed real server " + b.String()}, k
			}
			return f.postrouting(fam, t, k, b), k
		}
	}
	dest, found, ok := f.IPVS.schedule(k, t.src.Addr())
	switch {
	case ok && !found:
		return Verdict{Action: Rejected, VirtualServer: k.String(), Rule: "IPVS " + k.String() + ": no real server of weight > 0 (ICMP port unreachable)"}, k
	case ok:
		if open {
			if p.Proto == lb.UDP {
				if f.Conntrack.flows == nil {
					f.Conntrack.flows = map[udpFlowKey]netip.AddrPort{}
				}
				f.Conntrack.flows[udpFlowKey{t.src, t.dst}] = dest.addr
			} else {
				dest.active++
			}
		}
		return f.postrouting(fam, t, k, dest.addr), k
	}
	if p.Local {
		if v, ok := decided(f.Rules.walk(fam, "filter", "OUTPUT", t, &rule, 0)); ok {
			return v, k
		}
		if local {
			if v, ok := decided(f.Rules.walk(fam, "filter", "INPUT", t, &rule, 0)); ok {
				return v, k
			}
		}
	}
	return Verdict{Action: Untouched}, k
}

// postrouting sends t, IPVS-NATed to backend, through filter OUTPUT and nat
// POSTROUTING (IPVS with conntrack=1 re-enters the output path).
func (f *Fakes) postrouting(fam Family, t *tracedPacket, k vsKey, backend netip.AddrPort) Verdict {
	n := *t
	n.dst = backend
	var rule string
	switch f.Rules.walk(fam, "filter", "OUTPUT", &n, &rule, 0) {
	case vDrop:
		return Verdict{Action: Dropped, VirtualServer: k.String(), Rule: rule}
	case vReject:
		return Verdict{Action: Rejected, VirtualServer: k.String(), Rule: rule}
	}
	v := Verdict{Action: Forwarded, Backend: backend, VirtualServer: k.String()}
	if f.Rules.walk(fam, "nat", "POSTROUTING", &n, &rule, 0) == vMasquerade {
		v.Masquerade = true
	}
	return v
}
