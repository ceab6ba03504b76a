package ipvs_test

import (
	"context"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs/internal/cases"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs/ipvstest"
	"github.com/svcproxy/svcproxy/lb"
)

const nodeName = "node-a"

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// world is a fake kernel with the cases topology's node address and a Mode
// on it.
type world struct {
	t     testing.TB
	f     *ipvstest.Fakes
	m     *ipvs.Mode
	clock *fakeClock
	store *lb.Store
	port  uint16 // next client port
}

func newWorld(t testing.TB, cfg ipvs.Config) *world {
	t.Helper()
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	f := ipvstest.NewFakes(clock.Now)
	f.Links.AddNodeAddr("eth0", cases.NodeIP)
	return newWorldOn(t, f, clock, cfg)
}

func newWorldOn(t testing.TB, f *ipvstest.Fakes, clock *fakeClock, cfg ipvs.Config) *world {
	t.Helper()
	cfg = f.Config(cfg)
	cfg.Now = clock.Now
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t)
	}
	m, err := ipvs.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return &world{t: t, f: f, m: m, clock: clock, store: lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: nodeName}}), port: 40000}
}

// apply makes the store hold services and applies its snapshot.
func (w *world) apply(full bool, services ...lb.Service) {
	w.t.Helper()
	if err := w.tryApply(full, services...); err != nil {
		w.t.Fatalf("Apply(full=%v): %v", full, err)
	}
}

func (w *world) tryApply(full bool, services ...lb.Service) error {
	w.t.Helper()
	if _, err := w.store.Replace(services); err != nil {
		w.t.Fatalf("Replace: %v", err)
	}
	return w.m.Apply(context.Background(), w.store.Snapshot(), full)
}

// clientAddr is the source address a client uses towards dst.
func clientAddr(c cases.Client, dst netip.Addr) netip.Addr {
	switch c {
	case cases.Node:
		return dst // the node reaches its own (VIP or node) address from it
	case cases.Backend0:
		return cases.Backends[0]
	}
	return cases.PodIP
}

func (w *world) packet(from cases.Client, proto lb.Protocol, to netip.AddrPort) ipvstest.Packet {
	w.port++
	return ipvstest.Packet{
		Src:   netip.AddrPortFrom(clientAddr(from, to.Addr()), w.port),
		Dst:   to,
		Proto: proto,
		Local: from == cases.Node,
	}
}

// result turns a traced verdict into what a real client would have seen.
func result(v ipvstest.Verdict, client netip.Addr) cases.Result {
	r := cases.Result{Client: client, Backend: -1, Detail: v.String()}
	switch v.Action {
	case ipvstest.Forwarded:
		r.Outcome = cases.Reach
		r.Backend = slices.Index(cases.Backends, v.Backend.Addr())
		r.Src = client
		if v.Masquerade {
			r.Src = cases.NodeIP
		}
	case ipvstest.Rejected:
		r.Outcome = cases.Refused
	case ipvstest.Untouched:
		r.Outcome = cases.Gone
	default:
		r.Outcome = 255 // dropped: matches no expectation
	}
	return r
}

// probe runs p through the tracer, each connection opened and closed.
func (w *world) probe(p cases.Probe) []cases.Result {
	var out []cases.Result
	for range p.Count() {
		pkt := w.packet(p.From, p.Proto, p.To)
		c := w.f.Connect(pkt)
		c.Close()
		out = append(out, result(c.Route, pkt.Src.Addr()))
	}
	return out
}

// realServers returns the real servers of a virtual server (nil when it
// does not exist) as "addr wN".
func (w *world) realServers(proto lb.Protocol, vip netip.AddrPort) []string {
	for _, v := range w.f.IPVS.Services() {
		if v.Protocol == proto && v.Addr == vip {
			out := []string{}
			for _, r := range v.RealServers {
				out = append(out, r.Addr.String()+" w"+strconv.Itoa(r.Weight))
			}
			return out
		}
	}
	return nil
}

// virtualServers renders the fake's virtual servers that keep accepts.
func virtualServers(f *ipvstest.Fakes, keep func(ipvstest.VirtualServer) bool) []string {
	got := []string{}
	for _, v := range f.IPVS.Services() {
		if keep(v) {
			got = append(got, v.String())
		}
	}
	return got
}

// checkVirtualServers fails t unless got is want.
func checkVirtualServers(t *testing.T, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("virtual servers:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func be(i int) netip.AddrPort { return netip.AddrPortFrom(cases.Backends[i], cases.TCPPort) }

// dump renders the whole fake kernel, for comparing two worlds.
func dump(f *ipvstest.Fakes) string {
	var b strings.Builder
	for _, v := range f.IPVS.Services() {
		b.WriteString(v.String() + "\n")
	}
	if kind, addrs, ok := f.Links.Link(ipvs.DummyInterface); ok {
		slices.SortFunc(addrs, netip.Addr.Compare)
		b.WriteString(ipvs.DummyInterface + " " + kind + " " + fmtAddrs(addrs) + "\n")
	}
	b.WriteString(f.Rules.Dump())
	return b.String()
}

func fmtAddrs(a []netip.Addr) string {
	s := make([]string, len(a))
	for i, x := range a {
		s[i] = x.String()
	}
	return strings.Join(s, " ")
}
