// Command guest is the /init of the IPVS VM test: inside a VM with a stock
// Debian kernel it loads the IPVS, netfilter, dummy and veth modules, builds
// a pod namespace and three backend namespaces around the node (the initial
// namespace), runs real TCP and UDP servers in the backends, and runs the
// Service table of kernelmodes/ipvs/internal/cases through the real IPVS
// mode (moby/ipvs, rtnetlink, iptables-legacy and ipset when the initramfs
// has them, ctnetlink), checking each probe with real sockets (raw ones for
// SCTP, sctp.go). Results go to
// the serial console as VMTEST lines; then it reboots, which ends QEMU.
//
// It refuses to run unless it is PID 1.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	mobyipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/firewall"
	"github.com/svcproxy/svcproxy/internal/vmtest"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs/internal/cases"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
	"github.com/svcproxy/svcproxy/sysctl"
)

func main() {
	vmtest.Guest{Name: "the IPVS VM test's guest", Modules: true}.Run(run)
}

// host is one network namespace of the topology.
type host struct {
	name string
	ns   netns.NsHandle // the node's is the initial namespace
	ip   netip.Addr
}

type topology struct {
	node     host
	pod      host
	backends []host
}

func (t *topology) client(c cases.Client) host {
	switch c {
	case cases.Node:
		return t.node
	case cases.Backend0:
		return t.backends[0]
	}
	return t.pod
}

func run(r *vmtest.Reporter) error {
	ctx := context.Background()
	if err := ipvs.Available(); err != nil {
		return err
	}
	r.Pass("IPVS available")
	topo, err := buildTopology()
	if err != nil {
		return fmt.Errorf("building the topology: %w", err)
	}
	for i, b := range topo.backends {
		if err := serve(b, i); err != nil {
			return fmt.Errorf("starting backend%d: %w", i, err)
		}
		if err := serveSCTP(b, i); err != nil {
			return fmt.Errorf("starting backend%d: %w", i, err)
		}
	}
	var rules ipvs.Rules = &netfilter.Exec{Variant: "legacy"}
	if _, err := os.Stat("/usr/sbin/iptables-legacy-restore"); err != nil {
		rules = netfiltertest.NewFake()
		r.Note("no iptables-legacy in the initramfs: using the fake Rules (masquerade and reject checks will fail)")
	} else if v, err := rules.IPTablesVersion(ctx); err == nil {
		r.Note("rules: %s and ipset", v)
	}
	h, err := ipvs.NewIPVS()
	if err != nil {
		return err
	}
	counted := &countingIPVS{IPVS: h}
	links, err := ipvs.NewLinks(netns.None())
	if err != nil {
		return err
	}
	logCfg := zap.NewDevelopmentConfig()
	logCfg.Level = zap.NewAtomicLevelAt(zapcore.WarnLevel)
	logCfg.OutputPaths = []string{"stdout"}
	log, _ := logCfg.Build()
	m, err := ipvs.New(ipvs.Config{
		IPVS:         counted,
		Links:        links,
		Rules:        rules,
		Timeouts:     vmTimeouts,
		ExcludeCIDRs: []netip.Prefix{netip.PrefixFrom(topo.node.ip, 32)},
		Logger:       log,
	})
	if err != nil {
		return err
	}
	// Someone else's virtual server on the node IP, which the NodePorts
	// share: the exclusion keeps it through every sync and the cleanup.
	if err := h.NewService(foreignService(topo)); err != nil {
		return fmt.Errorf("adding a foreign virtual server: %w", err)
	}
	// The guest reads and tampers through a socket of its own: the mode's
	// sweeper dumps real servers on the mode's socket in the background,
	// and a second dump on the same netlink socket meanwhile fails with
	// EBUSY.
	inspect, err := ipvs.NewIPVS()
	if err != nil {
		return err
	}
	g := &guest{r: r, topo: topo, m: m, ipvs: inspect, counted: counted, store: lb.NewStore(lb.StoreOptions{})}
	for _, step := range cases.Steps() {
		t0 := time.Now()
		g.step(ctx, step)
		r.Note("step %q took %v", step.Name, time.Since(t0).Round(time.Millisecond))
	}
	g.finish(ctx, rules)
	return nil
}

// foreignService is a virtual server svcproxy did not make (a
// keepalived's, say) on the node IP, port 443.
func foreignService(t *topology) *mobyipvs.Service {
	return &mobyipvs.Service{Address: t.node.ip.AsSlice(), Protocol: syscall.IPPROTO_TCP, Port: 443,
		AddressFamily: syscall.AF_INET, Netmask: 0xffffffff, SchedName: "wlc"}
}

// vmTimeouts are the IPVS timeouts the guest's mode sets: none is the
// kernel's default (900s, 120s, 300s).
var vmTimeouts = ipvs.Timeouts{TimeoutTCP: time.Hour, TimeoutTCPFin: 30 * time.Second, TimeoutUDP: 45 * time.Second}

// checkTimeouts reports whether the kernel holds vmTimeouts.
func (g *guest) checkTimeouts(name string) {
	t, err := g.ipvs.GetConfig()
	switch {
	case err != nil:
		g.r.Fail(name, "GetConfig: %v", err)
	case *t != vmTimeouts:
		g.r.Fail(name, "timeouts %+v, want %+v", *t, vmTimeouts)
	default:
		g.r.Pass(name)
	}
}

// checkParameters reports whether the kernel holds the parameters the
// mode sets on this kernel (ipvs.Parameters).
func (g *guest) checkParameters(name string) {
	for _, p := range ipvs.Parameters(ipvs.KernelRelease()) {
		v, err := (sysctl.Files{}).Sysctl(p[0])
		if err != nil || v != p[1] {
			g.r.Fail(name, "%s = %q, %v; want %s", p[0], v, err, p[1])
			return
		}
	}
	g.r.Pass(name)
}

type guest struct {
	r       *vmtest.Reporter
	topo    *topology
	m       *ipvs.Mode
	ipvs    *mobyipvs.Handle
	counted *countingIPVS
	store   *lb.Store
}

func (g *guest) apply(ctx context.Context, services []lb.Service, full bool) error {
	if _, err := g.store.Replace(services); err != nil {
		return err
	}
	return g.m.Apply(ctx, g.store.Snapshot(), full)
}

func (g *guest) step(ctx context.Context, step cases.Step) {
	r := g.r
	var held *heldConn
	if h := step.Held; h != nil {
		var err error
		held, err = g.hold(*h)
		if err != nil {
			r.Fail(step.Name+": hold a connection", "%v", err)
			return
		}
		defer held.close()
	}
	t0 := time.Now()
	if !r.Check(step.Name+": apply", g.apply(ctx, step.Services, false)) {
		return
	}
	r.Note("apply took %v", time.Since(t0).Round(time.Microsecond))
	if h := step.Held; h != nil {
		g.checkHeld(ctx, step.Name, *h, held)
	}
	for _, p := range step.Probes {
		name := fmt.Sprintf("%s: %s", step.Name, p.Name)
		if msg := cases.Check(p, g.probe(p)); msg != "" {
			r.Fail(name, "%s", msg)
		} else {
			r.Pass(name)
		}
	}
	if h := step.Held; h != nil && h.Proto == lb.TCP {
		g.checkDrained(ctx, step.Name, *h, held)
	}
}

// finish checks a full resync, idempotence and Cleanup.
func (g *guest) finish(ctx context.Context, rules ipvs.Rules) {
	r := g.r
	svcs := cases.Steps()[len(cases.Steps())-1].Services
	if r.Check("a full sync applies", g.apply(ctx, svcs, true)) {
		if n := g.m.Repairs(); n != 0 {
			r.Fail("a full sync of an unchanged kernel finds nothing to repair", "Repairs() = %d", n)
		} else {
			r.Pass("a full sync of an unchanged kernel finds nothing to repair")
		}
		g.checkTimeouts("full syncs set the IPVS timeouts")
		g.checkParameters("full syncs set the IPVS mode's kernel parameters")
	}
	g.counted.n.Store(0)
	if r.Check("an unchanged incremental sync applies", g.apply(ctx, svcs, false)) {
		if n := g.counted.n.Load(); n != 0 {
			r.Fail("an unchanged incremental sync makes no IPVS calls", "%d calls", n)
		} else {
			r.Pass("an unchanged incremental sync makes no IPVS calls")
		}
	}
	// Tamper, then a full sync repairs.
	web := &mobyipvs.Service{Address: cases.StickyIP.Addr().AsSlice(), Protocol: syscall.IPPROTO_TCP, Port: cases.StickyIP.Port(), AddressFamily: syscall.AF_INET}
	if err := g.ipvs.DelService(web); err == nil {
		if err := g.ipvs.SetConfig(&mobyipvs.Config{TimeoutTCP: 7 * time.Second}); err != nil {
			r.Fail("set the TCP timeout behind the mode's back", "%v", err)
		}
		if err := (sysctl.Files{}).SetSysctl("net/ipv4/ip_forward", "0"); err != nil {
			r.Fail("turn ip_forward off behind the mode's back", "%v", err)
		}
		if r.Check("a full sync after tampering applies", g.apply(ctx, svcs, true)) {
			g.checkTimeouts("a full sync puts the IPVS timeouts back")
			g.checkParameters("a full sync turns ip_forward back on")
			if g.m.Repairs() != 1 {
				r.Fail("a full sync repairs a deleted virtual server", "Repairs() = %d", g.m.Repairs())
			}
			p := cases.Probe{From: cases.Pod, To: cases.StickyIP, N: 2, Backends: []int{0, 1, 2}, Sticky: true}
			if msg := cases.Check(p, g.probe(p)); msg != "" {
				r.Fail("a full sync repairs a deleted virtual server", "%s", msg)
			} else {
				r.Pass("a full sync repairs a deleted virtual server")
			}
		}
	}

	g.firewall(ctx, svcs)

	if !r.Check("cleanup", g.m.Cleanup(ctx)) {
		return
	}
	foreign := foreignService(g.topo)
	name := "a foreign virtual server on an excluded node IP outlives the syncs and the cleanup"
	if _, err := g.ipvs.GetService(foreign); err != nil {
		r.Fail(name, "%v", err)
	} else {
		r.Pass(name)
		if err := g.ipvs.DelService(foreign); err != nil {
			r.Fail("delete the foreign virtual server", "%v", err)
		}
	}
	var left []string
	svcList, err := g.ipvs.GetServices()
	if err != nil {
		left = append(left, err.Error())
	}
	for _, s := range svcList {
		left = append(left, fmt.Sprintf("virtual server %v:%d", s.Address, s.Port))
	}
	if _, err := netlink.LinkByName(ipvs.DummyInterface); err == nil {
		left = append(left, "interface "+ipvs.DummyInterface)
	}
	if out, err := rules.IPSetSave(ctx); err == nil && strings.Contains(string(out), "svcproxy-ipvs-") {
		left = append(left, "ipsets: "+string(out))
	}
	for _, tbl := range []string{"nat", "filter"} {
		if out, err := rules.IPTablesSave(ctx, ipvs.IPv4, tbl); err == nil && strings.Contains(string(out), "SVCPROXY-IPVS") {
			left = append(left, tbl+": "+string(out))
		}
	}
	if len(left) > 0 {
		r.Fail("cleanup removes everything", "%s", strings.Join(left, "; "))
	} else {
		r.Pass("cleanup removes everything")
	}
	p := cases.Probe{From: cases.Pod, To: cases.StickyIP, Outcome: cases.Gone}
	if msg := cases.Check(p, g.probe(p)); msg != "" {
		r.Fail("after cleanup, a ClusterIP is gone", "%s", msg)
	} else {
		r.Pass("after cleanup, a ClusterIP is gone")
	}
	g.schedulers(ctx)
}

// schedulers checks each scheduler on the real kernel: the virtual server
// gets it and new connections reach the endpoints. ClusterIP traffic from a
// pod needs no iptables rule, so the fake Rules save the tool runs.
func (g *guest) schedulers(ctx context.Context) {
	rules := netfiltertest.NewFake()
	links, err := ipvs.NewLinks(netns.None())
	if err != nil {
		g.r.Fail("schedulers", "%v", err)
		return
	}
	for _, sched := range ipvs.Schedulers {
		name := "scheduler " + sched
		m, err := ipvs.New(ipvs.Config{Scheduler: sched, IPVS: g.ipvs, Links: links, Rules: rules})
		if err != nil {
			g.r.Fail(name, "%v", err)
			continue
		}
		st := lb.NewStore(lb.StoreOptions{})
		if _, err := st.Replace([]lb.Service{cases.Web(0, 1, 2)}); err != nil {
			g.r.Fail(name, "%v", err)
			continue
		}
		if err := m.Apply(ctx, st.Snapshot(), true); err != nil {
			g.r.Fail(name, "apply: %v", err)
			m.Cleanup(ctx)
			continue
		}
		got := ""
		if svcs, err := g.ipvs.GetServices(); err == nil {
			for _, s := range svcs {
				if s.Port == cases.WebClusterIP.Port() && net.IP(s.Address).Equal(cases.WebClusterIP.Addr().AsSlice()) {
					got = s.SchedName
				}
			}
		}
		p := cases.Probe{From: cases.Pod, To: cases.WebClusterIP, N: 3, Backends: []int{0, 1, 2}}
		switch msg := cases.Check(p, g.probe(p)); {
		case got != sched:
			g.r.Fail(name, "the virtual server has scheduler %q", got)
		case msg != "":
			g.r.Fail(name, "%s", msg)
		default:
			g.r.Pass(name)
		}
		if err := m.Cleanup(ctx); err != nil {
			g.r.Fail(name+": cleanup", "%v", err)
		}
	}
}

// firewall runs loadBalancerSourceRanges in front of the IPVS mode for
// real: package firewall's nftables table (a prerouting hook ahead of any
// DNAT, so ahead of IPVS's LOCAL_IN) drops a pod's connections to the
// LoadBalancer IP while the Service's ranges leave the pod out, lets them
// through once a range takes it in, and leaves the ClusterIP alone. It
// puts back services, the table's state before, when it is done.
func (g *guest) firewall(ctx context.Context, services []lb.Service) {
	r := g.r
	fw := firewall.New(firewall.Config{Kernel: firewall.Netlink(""), NodeIPs: []netip.Addr{g.topo.node.ip}})
	apply := func(ranges ...netip.Prefix) error {
		web := cases.Web(0, 1)
		web.LoadBalancerSourceRanges = ranges
		if err := g.apply(ctx, append(slices.Clone(services), web), false); err != nil {
			return err
		}
		return fw.Apply(ctx, g.store.Snapshot(), false)
	}
	defer func() {
		r.Check("firewall: removed", errors.Join(fw.Cleanup(ctx), g.apply(ctx, services, false)))
	}()
	check := func(name string, p cases.Probe) {
		if msg := cases.Check(p, g.probe(p)); msg != "" {
			r.Fail(name, "%s", msg)
		} else {
			r.Pass(name)
		}
	}
	outside := netip.MustParsePrefix("203.0.113.0/24")
	if !r.Check("firewall: ranges without the pod applied", apply(outside)) {
		return
	}
	if fw.Frontends() != 1 {
		r.Fail("firewall: the LoadBalancer IP is restricted", "Frontends() = %d, want 1", fw.Frontends())
	}
	name := "firewall: a pod outside the LoadBalancer IP's ranges is dropped"
	if res := g.tcpProbe(g.topo.pod, cases.WebLBIP); res.Outcome != outcomeTimeout {
		r.Fail(name, "%v (%s), want a timeout", res.Outcome, res.Detail)
	} else {
		r.Pass(name)
	}
	check("firewall: the restricted Service's ClusterIP still serves the pod",
		cases.Probe{From: cases.Pod, To: cases.WebClusterIP, N: 2, Backends: []int{0, 1}, Balanced: true})
	if !r.Check("firewall: ranges with the pod applied", apply(outside, netip.PrefixFrom(g.topo.pod.ip, 32))) {
		return
	}
	check("firewall: a pod inside the ranges reaches the LoadBalancer IP",
		cases.Probe{From: cases.Pod, To: cases.WebLBIP, N: 2, Backends: []int{0, 1}, Balanced: true, Masq: cases.MasqYes})
}

// --- probes over real sockets ---

const (
	dialTimeout = 2 * time.Second
	readTimeout = 2 * time.Second
)

func (g *guest) probe(p cases.Probe) []cases.Result {
	out := make([]cases.Result, 0, p.Count())
	for range p.Count() {
		var res cases.Result
		switch p.Proto {
		case lb.UDP:
			res = g.udpProbe(g.topo.client(p.From), p.To)
		case lb.SCTP:
			res = g.sctpProbe(g.topo.client(p.From), p.To)
		default:
			res = g.tcpProbe(g.topo.client(p.From), p.To)
		}
		// "Gone" is any failure that reached no backend but a timeout.
		if p.Outcome == cases.Gone && (res.Outcome == cases.Refused || res.Outcome == outcomeUnreachable) {
			res.Outcome = cases.Gone
		}
		out = append(out, res)
	}
	return out
}

// outcomeUnreachable is a client seeing host or network unreachable; it
// matches no expectation but Gone.
const (
	outcomeUnreachable cases.Outcome = 100 + iota
	outcomeTimeout
	outcomeError
)

func classify(err error) (cases.Outcome, string) {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET):
		return cases.Refused, err.Error()
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return outcomeUnreachable, err.Error()
	case errors.As(err, &ne) && ne.Timeout():
		return outcomeTimeout, err.Error()
	}
	return outcomeError, err.Error()
}

// greeting parses a backend's "b<index> <source addr:port>" line.
func greeting(line string) (int, netip.Addr, error) {
	f := strings.Fields(line)
	if len(f) != 2 || !strings.HasPrefix(f[0], "b") {
		return -1, netip.Addr{}, fmt.Errorf("unexpected greeting %q", line)
	}
	i, err := strconv.Atoi(f[0][1:])
	if err != nil {
		return -1, netip.Addr{}, fmt.Errorf("unexpected greeting %q", line)
	}
	src, err := netip.ParseAddrPort(f[1])
	return i, src.Addr().Unmap(), err
}

func localAddr(c net.Conn) netip.Addr {
	if a, err := netip.ParseAddrPort(c.LocalAddr().String()); err == nil {
		return a.Addr().Unmap()
	}
	return netip.Addr{}
}

func (g *guest) tcpProbe(from host, to netip.AddrPort) cases.Result {
	var conn net.Conn
	err := vmtest.InNetNS(from.ns, func() error {
		var err error
		conn, err = net.DialTimeout("tcp4", to.String(), dialTimeout)
		return err
	})
	if err != nil {
		o, d := classify(err)
		return cases.Result{Outcome: o, Backend: -1, Detail: d}
	}
	defer resetClose(conn)
	res := cases.Result{Client: localAddr(conn), Backend: -1}
	conn.SetReadDeadline(time.Now().Add(readTimeout))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		res.Outcome, res.Detail = classify(err)
		return res
	}
	if res.Backend, res.Src, err = greeting(line); err != nil {
		res.Outcome, res.Detail = outcomeError, err.Error()
		return res
	}
	res.Outcome = cases.Reach
	return res
}

// resetClose closes with a reset, so IPVS forgets the connection in
// seconds (CLOSE state) rather than minutes (TIME_WAIT): the drain checks
// wait for it.
func resetClose(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

func udpDial(from host, to netip.AddrPort) (*net.UDPConn, error) {
	var conn *net.UDPConn
	err := vmtest.InNetNS(from.ns, func() error {
		var err error
		conn, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(to))
		return err
	})
	return conn, err
}

// udpExchange sends on conn until a reply comes, up to tries times.
func udpExchange(conn *net.UDPConn, tries int) (string, error) {
	buf := make([]byte, 512)
	var err error
	for range tries {
		if _, err = conn.Write([]byte("hello\n")); err != nil {
			continue
		}
		conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		var n int
		if n, err = conn.Read(buf); err == nil {
			return strings.TrimSpace(string(buf[:n])), nil
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			return "", err
		}
	}
	return "", err
}

func (g *guest) udpProbe(from host, to netip.AddrPort) cases.Result {
	conn, err := udpDial(from, to)
	if err != nil {
		o, d := classify(err)
		return cases.Result{Outcome: o, Backend: -1, Detail: d}
	}
	defer conn.Close()
	res := cases.Result{Client: localAddr(conn), Backend: -1}
	line, err := udpExchange(conn, 3)
	if err != nil {
		res.Outcome, res.Detail = classify(err)
		return res
	}
	if res.Backend, res.Src, err = greeting(line); err != nil {
		res.Outcome, res.Detail = outcomeError, err.Error()
		return res
	}
	res.Outcome = cases.Reach
	return res
}

// --- held connections: drain and UDP flow moves ---

type heldConn struct {
	tcp *net.TCPConn
	rd  *bufio.Reader
	udp *net.UDPConn
}

func (h *heldConn) close() {
	if h.tcp != nil {
		resetClose(h.tcp)
	}
	if h.udp != nil {
		h.udp.Close()
	}
}

// hold opens connections (flows) until one lands on h.Backend.
func (g *guest) hold(h cases.Held) (*heldConn, error) {
	from := g.topo.client(h.From)
	for range 10 {
		if h.Proto == lb.UDP {
			conn, err := udpDial(from, h.To)
			if err != nil {
				return nil, err
			}
			line, err := udpExchange(conn, 3)
			if i, _, gerr := greeting(line); err == nil && gerr == nil && i == h.Backend {
				return &heldConn{udp: conn}, nil
			}
			conn.Close()
			continue
		}
		var conn net.Conn
		if err := vmtest.InNetNS(from.ns, func() error {
			var err error
			conn, err = net.DialTimeout("tcp4", h.To.String(), dialTimeout)
			return err
		}); err != nil {
			return nil, err
		}
		rd := bufio.NewReader(conn)
		conn.SetReadDeadline(time.Now().Add(readTimeout))
		line, err := rd.ReadString('\n')
		if i, _, gerr := greeting(line); err == nil && gerr == nil && i == h.Backend {
			conn.SetReadDeadline(time.Time{})
			return &heldConn{tcp: conn.(*net.TCPConn), rd: rd}, nil
		}
		resetClose(conn)
	}
	return nil, fmt.Errorf("no connection through %v landed on backend%d in 10 tries", h.To, h.Backend)
}

// realServers returns the real servers of a virtual server with weights.
func (g *guest) realServers(proto lb.Protocol, vip netip.AddrPort) (map[netip.AddrPort]*mobyipvs.Destination, error) {
	s := &mobyipvs.Service{Address: vip.Addr().AsSlice(), Protocol: syscall.IPPROTO_TCP, Port: vip.Port(), AddressFamily: syscall.AF_INET}
	if proto == lb.UDP {
		s.Protocol = syscall.IPPROTO_UDP
	}
	ds, err := g.ipvs.GetDestinations(s)
	if err != nil {
		return nil, err
	}
	out := map[netip.AddrPort]*mobyipvs.Destination{}
	for _, d := range ds {
		a, _ := netip.AddrFromSlice(d.Address)
		out[netip.AddrPortFrom(a.Unmap(), d.Port)] = d
	}
	return out, nil
}

func (g *guest) checkHeld(ctx context.Context, step string, h cases.Held, held *heldConn) {
	r := g.r
	port := cases.TCPPort
	if h.Proto == lb.UDP {
		port = cases.UDPPort
	}
	gone := netip.AddrPortFrom(cases.Backends[h.Backend], port)
	rs, err := g.realServers(h.Proto, h.To)
	if err != nil {
		r.Fail(step+": read real servers", "%v", err)
		return
	}
	if h.Proto == lb.UDP {
		if d := rs[gone]; d != nil {
			r.Fail(step+": the removed UDP real server is deleted at once", "still there with weight %d", d.Weight)
		} else {
			r.Pass(step + ": the removed UDP real server is deleted at once")
		}
		// The flow's next datagram: the stale IPVS connection is expired
		// (expire_nodest_conn) and conntrack was cleared, so it is
		// scheduled afresh (the first datagram may be dropped doing so).
		line, err := udpExchange(held.udp, 6)
		i, _, gerr := greeting(line)
		switch {
		case err != nil:
			r.Fail(step+": the held flow moves to another endpoint", "%v", err)
		case gerr != nil || i == h.Backend:
			r.Fail(step+": the held flow moves to another endpoint", "answered %q", line)
		default:
			r.Pass(step + ": the held flow moves to another endpoint")
		}
		return
	}
	d := rs[gone]
	switch {
	case d == nil:
		r.Fail(step+": the removed real server drains at weight 0", "it was deleted with a connection open")
	case d.Weight != 0:
		r.Fail(step+": the removed real server drains at weight 0", "weight %d", d.Weight)
	default:
		r.Pass(fmt.Sprintf("%s: the removed real server drains at weight 0 (active %d, inactive %d)", step, d.ActiveConnections, d.InactiveConnections))
	}
	if g.m.Draining() == 0 {
		r.Fail(step+": Draining() counts it", "0")
	}
	held.tcp.SetDeadline(time.Now().Add(readTimeout))
	_, err = held.tcp.Write([]byte("ping\n"))
	line := ""
	if err == nil {
		line, err = held.rd.ReadString('\n')
	}
	if err != nil || strings.TrimSpace(line) != "ping" {
		r.Fail(step+": the held connection keeps working while draining", "got %q, %v", line, err)
	} else {
		r.Pass(step + ": the held connection keeps working while draining")
	}
}

func (g *guest) checkDrained(ctx context.Context, step string, h cases.Held, held *heldConn) {
	held.close()
	gone := netip.AddrPortFrom(cases.Backends[h.Backend], cases.TCPPort)
	start := time.Now()
	for time.Since(start) < 45*time.Second {
		if err := g.m.Sweep(ctx); err != nil {
			g.r.Fail(step+": sweep", "%v", err)
			return
		}
		rs, err := g.realServers(h.Proto, h.To)
		if err != nil {
			g.r.Fail(step+": read real servers", "%v", err)
			return
		}
		if rs[gone] == nil {
			g.r.Pass(fmt.Sprintf("%s: once its connections are gone the sweep deletes it (after %v)", step, time.Since(start).Round(100*time.Millisecond)))
			return
		}
		time.Sleep(time.Second)
	}
	g.r.Fail(step+": once its connections are gone the sweep deletes it", "still there after %v", time.Since(start).Round(time.Second))
}

// --- topology ---

// buildTopology makes the pod and backend namespaces, each with a veth
// pair to the node: /32 addresses on both ends, the node as every other
// host's default gateway (the CNI ptp shape).
func buildTopology() (*topology, error) {
	t := &topology{node: host{name: "node", ns: netns.None(), ip: cases.NodeIP}}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); err != nil {
		return nil, err
	}
	node, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	lo, err := node.LinkByName("lo")
	if err != nil {
		return nil, err
	}
	if err := node.LinkSetUp(lo); err != nil {
		return nil, err
	}
	add := func(name string, ip netip.Addr) (host, error) {
		ns, err := vmtest.NewNetNS()
		if err != nil {
			return host{}, err
		}
		h := host{name: name, ns: ns, ip: ip}
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "v-" + name}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}
		if err := node.LinkAdd(veth); err != nil {
			return h, fmt.Errorf("veth for %s: %w", name, err)
		}
		nl, err := node.LinkByName("v-" + name)
		if err != nil {
			return h, err
		}
		if err := node.AddrAdd(nl, &netlink.Addr{IPNet: &net.IPNet{IP: cases.NodeIP.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			return h, err
		}
		if err := node.LinkSetUp(nl); err != nil {
			return h, err
		}
		if err := node.RouteAdd(vmtest.HostRoute(nl, ip)); err != nil {
			return h, err
		}
		in, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
		if err != nil {
			return h, err
		}
		defer in.Close()
		for _, n := range []string{"lo", "eth0"} {
			l, err := in.LinkByName(n)
			if err != nil {
				return h, err
			}
			if err := in.LinkSetUp(l); err != nil {
				return h, err
			}
		}
		eth0, _ := in.LinkByName("eth0")
		if err := in.AddrAdd(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			return h, err
		}
		if err := in.RouteAdd(vmtest.HostRoute(eth0, cases.NodeIP)); err != nil {
			return h, err
		}
		if err := in.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: cases.NodeIP.AsSlice()}); err != nil {
			return h, fmt.Errorf("default route of %s: %w", name, err)
		}
		return h, nil
	}
	if t.pod, err = add("pod", cases.PodIP); err != nil {
		return nil, err
	}
	for i, ip := range cases.Backends {
		b, err := add("b"+strconv.Itoa(i), ip)
		if err != nil {
			return nil, err
		}
		t.backends = append(t.backends, b)
	}
	return t, nil
}

// serve runs backend i's servers in its namespace: TCP greets with
// "b<i> <client addr>" then echoes lines; UDP answers each datagram so.
func serve(b host, i int) error {
	var ln net.Listener
	var pc net.PacketConn
	if err := vmtest.InNetNS(b.ns, func() error {
		var err error
		if ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", cases.TCPPort)); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp4", fmt.Sprintf(":%d", cases.UDPPort))
		return err
	}); err != nil {
		return err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintf(c, "b%d %s\n", i, c.RemoteAddr())
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					fmt.Fprintf(c, "%s\n", sc.Text())
				}
			}()
		}
	}()
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(fmt.Sprintf("b%d %s\n", i, from)), from)
		}
	}()
	return nil
}

// countingIPVS counts every IPVS call, for the idempotence check.
type countingIPVS struct {
	ipvs.IPVS
	n atomic.Int64
}

func (c *countingIPVS) GetServices() ([]*mobyipvs.Service, error) {
	c.n.Add(1)
	return c.IPVS.GetServices()
}

func (c *countingIPVS) NewService(s *mobyipvs.Service) error {
	c.n.Add(1)
	return c.IPVS.NewService(s)
}

func (c *countingIPVS) UpdateService(s *mobyipvs.Service) error {
	c.n.Add(1)
	return c.IPVS.UpdateService(s)
}

func (c *countingIPVS) DelService(s *mobyipvs.Service) error {
	c.n.Add(1)
	return c.IPVS.DelService(s)
}

func (c *countingIPVS) GetDestinations(s *mobyipvs.Service) ([]*mobyipvs.Destination, error) {
	c.n.Add(1)
	return c.IPVS.GetDestinations(s)
}

func (c *countingIPVS) NewDestination(s *mobyipvs.Service, d *mobyipvs.Destination) error {
	c.n.Add(1)
	return c.IPVS.NewDestination(s, d)
}

func (c *countingIPVS) UpdateDestination(s *mobyipvs.Service, d *mobyipvs.Destination) error {
	c.n.Add(1)
	return c.IPVS.UpdateDestination(s, d)
}

func (c *countingIPVS) DelDestination(s *mobyipvs.Service, d *mobyipvs.Destination) error {
	c.n.Add(1)
	return c.IPVS.DelDestination(s, d)
}

func (c *countingIPVS) GetConfig() (*mobyipvs.Config, error) {
	c.n.Add(1)
	return c.IPVS.GetConfig()
}

func (c *countingIPVS) SetConfig(t *mobyipvs.Config) error {
	c.n.Add(1)
	return c.IPVS.SetConfig(t)
}
