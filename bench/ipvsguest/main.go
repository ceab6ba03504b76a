// Command ipvsguest is the /init of the bench's IPVS VM (bench --ipvs-vm):
// inside a QEMU VM with a stock Debian kernel (IPVS as modules, which the
// bench's host cannot load) it measures svcproxy's IPVS mode beside
// baselines run in the same VM, so the ratios between them mean something
// even though the emulated CPU's absolute figures do not compare with the
// host's:
//
//   - the data path: keep-alive requests/s and new connections/s from a pod
//     namespace through a ClusterIP to three backend namespaces (veth), for
//     direct (no proxy), svcproxy-userspace, svcproxy-iptables
//     (iptables-legacy) and svcproxy-ipvs, interleaved over rounds, each
//     (round, mode) on fresh pod and backend namespaces;
//   - the control plane: programming N Services × E endpoints from scratch
//     with the mode's Apply and then one endpoint change at a time.
//
// The modes are svcproxy's own packages (kernelmodes/ipvs,
// kernelmodes/iptables, forwarder + redirect) driven in this process from
// an lb.Store, as cmd/svcproxy's sync runner drives them; the load
// generator and the HTTP backends are small Go programs in this process.
//
// It reads its settings (vmwire.Config) from vmwire.ConfigPath and prints
// its results on the serial console as vmwire records in vmtest notes; then
// it reboots, which ends QEMU. It refuses to run unless it is PID 1.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"

	mobyipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/bench/internal/vmwire"
	"github.com/svcproxy/svcproxy/internal/vmtest"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/lb"
)

func main() {
	start := time.Now()
	vmtest.Guest{Name: "ipvsguest (the bench's IPVS VM)", Modules: true}.Run(func(r *vmtest.Reporter) error {
		g := &guest{r: r, start: start, modes: map[string]*vmwire.Mode{}}
		if err := g.run(context.Background()); err != nil {
			r.Fail("setup", "%v", err)
			for _, name := range g.cfg.Modes {
				m := g.mode(name)
				if m.Status == "" {
					m.Status = "failed"
					m.Errors = append(m.Errors, "the VM's set-up failed: "+err.Error())
				}
			}
		}
		g.finish()
		return nil
	})
}

type guest struct {
	r     *vmtest.Reporter
	start time.Time
	cfg   vmwire.Config
	k     kernelTools
	info  vmwire.Info
	// modes is what became of each mode, printed at the end.
	modes map[string]*vmwire.Mode
	// lastCP is, per mode, the last control-plane scale run and how long
	// it took in all, to predict the next.
	lastCP map[string][2]float64
}

func (g *guest) mode(name string) *vmwire.Mode {
	m := g.modes[name]
	if m == nil {
		m = &vmwire.Mode{Name: name, Describe: describe(name)}
		g.modes[name] = m
	}
	return m
}

func (g *guest) emit(rec vmwire.Record) { g.r.Note("%s", rec.Line()) }

func (g *guest) sample(round int, mode, test, metric string, v float64, unit string) {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return // not measured; JSON has no NaN
	}
	g.emit(vmwire.Record{Sample: &vmwire.Sample{Round: round, Mode: mode, Test: test, Metric: metric, Value: v, Unit: unit, Tool: g.info.LoadGen}})
}

func (g *guest) fail(mode, format string, args ...any) {
	m := g.mode(mode)
	m.Status = "failed"
	m.Errors = append(m.Errors, fmt.Sprintf(format, args...))
	g.r.Fail(mode, format, args...)
}

func (g *guest) runs(test string) bool { return slices.Contains(g.cfg.Tests, test) }

func (g *guest) run(ctx context.Context) error {
	b, err := os.ReadFile(vmwire.ConfigPath)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &g.cfg); err != nil {
		return fmt.Errorf("%s: %w", vmwire.ConfigPath, err)
	}
	for _, m := range g.cfg.Modes {
		g.mode(m)
	}
	g.info = describeGuest()
	g.emit(vmwire.Record{Info: &g.info})

	if err := vmtest.InitNode(); err != nil {
		return fmt.Errorf("setting up the node: %w", err)
	}
	if err := ipvs.Available(); err != nil {
		return err
	}
	h, err := ipvs.NewIPVS()
	if err != nil {
		return err
	}
	links, err := ipvs.NewLinks(netns.None())
	if err != nil {
		return err
	}
	logCfg := zap.NewDevelopmentConfig()
	logCfg.Level = zap.NewAtomicLevelAt(zapcore.WarnLevel)
	logCfg.OutputPaths = []string{"stdout"}
	log, _ := logCfg.Build()
	g.k = kernelTools{ipvs: h, links: links, log: log}

	if g.runs(vmwire.TestKeepAlive) || g.runs(vmwire.TestConnRate) {
		for round := 1; round <= g.cfg.Rounds; round++ {
			for _, mode := range g.cfg.Modes {
				g.dataRound(ctx, round, mode)
			}
		}
	}
	if g.runs(vmwire.TestControl) {
		g.lastCP = map[string][2]float64{}
		// IPVS first: it is what the VM is for, should the budget run out.
		order := []string{vmwire.ModeIPVS}
		for _, m := range g.cfg.Modes {
			if m != vmwire.ModeDirect && m != vmwire.ModeIPVS {
				order = append(order, m)
			}
		}
		scales := slices.Sorted(slices.Values(g.cfg.Scales))
		for _, n := range scales {
			for _, mode := range order {
				g.control(ctx, mode, n)
			}
		}
	}
	return nil
}

// finish prints each mode's outcome and the closing info.
func (g *guest) finish() {
	for _, name := range g.cfg.Modes {
		m := g.mode(name)
		if m.Status == "" {
			m.Status = "ran"
		}
		m.Notes = uniq(m.Notes)
		g.emit(vmwire.Record{Mode: m})
	}
	g.info.GuestS = time.Since(g.start).Seconds()
	g.emit(vmwire.Record{Info: &g.info})
}

func uniq(s []string) []string {
	var out []string
	for _, x := range s {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

func describeGuest() vmwire.Info {
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	in := vmwire.Info{
		Kernel:     unix.ByteSliceToString(uts.Release[:]),
		CPUs:       runtime.NumCPU(),
		LoadGen:    "built-in Go HTTP/1.1 client in the guest",
		HTTPServer: "built-in Go HTTP/1.1 server in each backend namespace",
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kib int
		for line := range strings.Lines(string(b)) {
			if _, err := fmt.Sscanf(line, "MemTotal: %d kB", &kib); err == nil {
				in.MemoryMiB = kib / 1024
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				in.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if out, err := exec.Command("iptables-legacy", "--version").Output(); err == nil {
		in.IPTables = strings.TrimSpace(string(out))
	}
	return in
}

// dataRound measures one mode once on a fresh pod and fresh backends.
func (g *guest) dataRound(ctx context.Context, round int, mode string) {
	g.r.Note("step round %d/%d · %s · set-up", round, g.cfg.Rounds, mode)
	topo, err := newTopology()
	if err != nil {
		g.fail(mode, "round %d: building the namespaces: %v", round, err)
		return
	}
	defer topo.close()
	// No mode inherits another's connections in the node either.
	_ = netlink.ConntrackTableFlush(netlink.ConntrackTable)

	target := netip.AddrPortFrom(backendIPs[0], backendPort)
	p, notes, err := g.k.newProxy(ctx, mode)
	if err != nil {
		g.fail(mode, "round %d: %v", round, err)
		return
	}
	m := g.mode(mode)
	m.Notes = append(m.Notes, notes...)
	if p != nil {
		target = serviceVIP
		defer func() {
			if u, ok := p.(*userspace); ok {
				m.Notes = append(m.Notes, fmt.Sprintf("round %d: %s", round, u.counters()))
			}
			if err := p.Cleanup(ctx); err != nil {
				g.fail(mode, "round %d: cleanup: %v", round, err)
			}
		}()
		st := lb.NewStore(lb.StoreOptions{})
		snap, err := st.Replace([]lb.Service{dataService()})
		if err == nil {
			err = p.Apply(ctx, snap, true)
		}
		if err != nil {
			g.fail(mode, "round %d: programming the Service: %v", round, err)
			return
		}
	}
	if err := g.check(ctx, topo, target); err != nil {
		g.fail(mode, "round %d: the pod cannot reach %v: %v", round, target, err)
		return
	}
	d := time.Duration(g.cfg.DurationS * float64(time.Second))
	if g.runs(vmwire.TestKeepAlive) {
		g.r.Note("step round %d/%d · %s · keep-alive", round, g.cfg.Rounds, mode)
		cpu0, _ := cpuBusy()
		res, err := keepAlive(ctx, topo.pod, target, g.cfg.Conns, d)
		cpu1, _ := cpuBusy()
		if err != nil {
			g.fail(mode, "round %d: keep-alive: %v", round, err)
		} else {
			t := vmwire.TestKeepAlive
			g.sample(round, mode, t, "rps", res.rate(), "req/s")
			g.sample(round, mode, t, "p50_ms", ms(res.percentile(50)), "ms")
			g.sample(round, mode, t, "p90_ms", ms(res.percentile(90)), "ms")
			g.sample(round, mode, t, "p99_ms", ms(res.percentile(99)), "ms")
			g.sample(round, mode, t, "errors", float64(res.errorCount()), "")
			if res.Requests > 0 && cpu1 > cpu0 {
				g.sample(round, mode, t, "vm_cpu_us_per_req", (cpu1-cpu0)*1e6/float64(res.Requests), "µs")
			}
			if n := res.errorCount(); n > 0 {
				m.Notes = append(m.Notes, fmt.Sprintf("round %d keep-alive: %d errors %v", round, n, res.Errors))
			}
		}
	}
	defer func() {
		// Conntrack tracks the node's traffic only while rules (or IPVS)
		// need it: not for direct, as on the host.
		if b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_count"); err == nil {
			m.Notes = append(m.Notes, fmt.Sprintf("round %d: %s conntrack entries in the node after the tests", round, strings.TrimSpace(string(b))))
		}
	}()
	if g.runs(vmwire.TestConnRate) {
		g.r.Note("step round %d/%d · %s · new connections", round, g.cfg.Rounds, mode)
		c0, _ := synRetrans(topo.pod)
		n0, _ := synRetrans(vmtest.GuestHost{NS: netns.None()})
		cpu0, _ := cpuBusy()
		res, err := connRate(ctx, topo.pod, target, g.cfg.Conns, d)
		cpu1, _ := cpuBusy()
		c1, _ := synRetrans(topo.pod)
		n1, _ := synRetrans(vmtest.GuestHost{NS: netns.None()})
		if err != nil {
			g.fail(mode, "round %d: new connections: %v", round, err)
		} else {
			t := vmwire.TestConnRate
			g.sample(round, mode, t, "conn_per_s", res.rate(), "conn/s")
			g.sample(round, mode, t, "errors", float64(res.errorCount()), "")
			g.sample(round, mode, t, "syn_retrans_client", float64(c1-c0), "")
			g.sample(round, mode, t, "syn_retrans_node", float64(n1-n0), "")
			if res.Requests > 0 && cpu1 > cpu0 {
				g.sample(round, mode, t, "vm_cpu_us_per_conn", (cpu1-cpu0)*1e6/float64(res.Requests), "µs")
			}
			if n := res.errorCount(); n > 0 {
				m.Notes = append(m.Notes, fmt.Sprintf("round %d new connections: %d errors %v", round, n, res.Errors))
			}
		}
	}
}

// check makes one request from the pod to target, retrying for 3 s.
func (g *guest) check(ctx context.Context, topo *topology, target netip.AddrPort) error {
	var err error
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if err = request(ctx, topo.pod, target); err == nil {
			return nil
		}
	}
	return err
}

func fmtCount(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// control programs n Services from scratch with a fresh instance of mode,
// then applies the endpoint changes one at a time, then cleans up.
func (g *guest) control(ctx context.Context, mode string, n int) {
	rec := &vmwire.Control{Mode: mode, Services: n, Endpoints: n * g.cfg.Endpoints}
	defer func() { g.emit(vmwire.Record{Control: rec}) }()
	if g.cfg.BudgetS > 0 {
		left := g.cfg.BudgetS - time.Since(g.start).Seconds()
		last, ok := g.lastCP[mode]
		switch {
		case left <= 0:
			rec.Skipped = fmt.Sprintf("the VM's time budget (%.0f s) is spent", g.cfg.BudgetS)
		case ok && last[1]*float64(n)/last[0] > left:
			rec.Skipped = fmt.Sprintf("predicted %.0f s from %s Services (%.0f s), %.0f s of the VM's time budget left", last[1]*float64(n)/last[0], fmtCount(int(last[0])), last[1], left)
		}
		if rec.Skipped != "" {
			g.r.Note("step control plane · %s · %d Services: skipped, %s", mode, n, rec.Skipped)
			return
		}
	}
	g.r.Note("step control plane · %s · %d Services × %d endpoints", mode, n, g.cfg.Endpoints)
	began := time.Now()
	defer func() { g.lastCP[mode] = [2]float64{float64(n), time.Since(began).Seconds()} }()
	p, _, err := g.k.newProxy(ctx, mode)
	if err != nil {
		rec.Error = err.Error()
		g.fail(mode, "control plane, %d Services: %v", n, err)
		return
	}
	services := genServices(n, g.cfg.Endpoints)
	st := lb.NewStore(lb.StoreOptions{})
	g.k.calls.take()
	t0 := time.Now()
	snap, err := st.Replace(services)
	t1 := time.Now()
	if err == nil {
		err = p.Apply(ctx, snap, true)
	}
	t2 := time.Now()
	if err != nil {
		rec.Error = "programming: " + err.Error()
		g.fail(mode, "control plane, %d Services: %s", n, rec.Error)
		_ = p.Cleanup(ctx)
		return
	}
	rec.ProgramS, rec.ProgramTotalS = t2.Sub(t1).Seconds(), t2.Sub(t0).Seconds()
	if mode == vmwire.ModeIPVS {
		rec.Notes = append(rec.Notes, "programming: "+summary(g.k.calls.take(), t2.Sub(t1)))
	}
	var applied time.Duration
	if mode == vmwire.ModeIPVS {
		if got, err := g.k.ipvs.GetServices(); err != nil || len(got) != n {
			rec.Error = fmt.Sprintf("after programming, IPVS holds %d virtual servers (%v), want %d", len(got), err, n)
			g.fail(mode, "control plane, %d Services: %s", n, rec.Error)
		}
	}
	for i := range g.cfg.Changes {
		g.r.Note("step control plane · %s · %d Services · change %d/%d", mode, n, i+1, g.cfg.Changes)
		svc := change(services, i)
		t0 := time.Now()
		snap, err := st.Update([]lb.Service{svc}, nil)
		t1 := time.Now()
		if err == nil {
			err = p.Apply(ctx, snap, false)
		}
		t2 := time.Now()
		if err != nil {
			rec.Error = fmt.Sprintf("change %d: %v", i+1, err)
			g.fail(mode, "control plane, %d Services: %s", n, rec.Error)
			break
		}
		applied += t2.Sub(t1)
		rec.ChangesMs = append(rec.ChangesMs, ms(t2.Sub(t1)))
		rec.ChangesTotalMs = append(rec.ChangesTotalMs, ms(t2.Sub(t0)))
	}
	if mode == vmwire.ModeIPVS && len(rec.ChangesMs) > 0 {
		rec.Notes = append(rec.Notes, fmt.Sprintf("the %d changes together: %s", len(rec.ChangesMs), summary(g.k.calls.take(), applied)))
	}
	if mode == vmwire.ModeIPVS && rec.Error == "" {
		if err := g.checkChanged(services, g.cfg.Changes); err != nil {
			rec.Error = err.Error()
			g.fail(mode, "control plane, %d Services: %s", n, rec.Error)
		}
	}
	t0 = time.Now()
	if err := p.Cleanup(ctx); err != nil {
		g.fail(mode, "control plane, %d Services: cleanup: %v", n, err)
	}
	rec.Notes = append(rec.Notes, fmt.Sprintf("cleanup (removing every Service) took %.1f s", time.Since(t0).Seconds()))
}

// checkChanged checks the last change is live in IPVS: the new endpoint is
// a real server of its Service.
func (g *guest) checkChanged(services []lb.Service, changes int) error {
	if changes == 0 {
		return nil
	}
	m := changes - 1
	s := services[(m*7919+13)%len(services)]
	ep := s.Endpoints[m%len(s.Endpoints)].Addr
	vip := netip.AddrPortFrom(s.ClusterIPs[0], s.Port)
	dests, err := g.k.ipvs.GetDestinations(ipvsService(vip))
	if err != nil {
		return fmt.Errorf("reading the real servers of %v: %w", vip, err)
	}
	for _, d := range dests {
		if a, ok := netip.AddrFromSlice(d.Address); ok && a.Unmap() == ep.Addr() && d.Port == ep.Port() && d.Weight > 0 {
			return nil
		}
	}
	return fmt.Errorf("after the changes, %v has no live real server %v", vip, ep)
}

func ipvsService(vip netip.AddrPort) *mobyipvs.Service {
	return &mobyipvs.Service{Address: net.IP(vip.Addr().AsSlice()), Protocol: unix.IPPROTO_TCP, Port: vip.Port(), AddressFamily: unix.AF_INET}
}
