package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// writeResults writes results.json, the charts and results.md into res.Dir.
func writeResults(res *Results) error {
	if err := res.writeJSON(res.Dir); err != nil {
		return err
	}
	charts := res.charts()
	for name, c := range charts {
		if err := os.WriteFile(filepath.Join(res.Dir, name), []byte(c.SVG()), 0o644); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(res.Dir, "results.md"), []byte(res.markdown(charts)), 0o644)
}

// rerender writes dir's results.md and charts again from its results.json.
func rerender(dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		return err
	}
	var r Results
	if err := json.Unmarshal(data, &r); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(dir, "results.json"), err)
	}
	r.Dir = dir
	return writeResults(&r)
}

// ranModes are the modes with at least one data-path sample, in run order.
func (r *Results) ranModes() []string {
	var names []string
	for _, m := range r.Modes {
		if m.Status != "skipped" {
			names = append(names, m.Name)
		}
	}
	return r.ran(names)
}

// column is one figure in a table.
type column struct {
	head         string
	test, metric string
	format       func(float64) string
	higherBetter bool
}

var (
	f1   = func(v float64) string { return fmt.Sprintf("%.1f", v) }
	f2   = func(v float64) string { return fmt.Sprintf("%.2f", v) }
	f0   = func(v float64) string { return fmt.Sprintf("%.0f", v) }
	fk   = func(v float64) string { return fmtNum(v) }
	fInt = func(v float64) string { return fmt.Sprintf("%d", int64(math.Round(v))) }
)

var dataColumns = []column{
	{"bulk 1 stream Gbit/s", testBulk1, "gbps", f1, true},
	{"bulk 4 streams Gbit/s", testBulk4, "gbps", f1, true},
	{"keep-alive req/s", testKeepAlive, "rps", fk, true},
	{"p50 ms", testKeepAlive, "p50_ms", f2, false},
	{"p99 ms", testKeepAlive, "p99_ms", f2, false},
	{"new conn/s", testConnRate, "conn_per_s", fk, true},
	{"1 MiB transfers/s", testMiB, "per_s", fk, true},
}

// costColumns: the RSS column is at the number of idle connections asked
// for; when fewer could be opened it is scaled from those (see the note).
func (r *Results) costColumns() []column {
	return []column{
		{"CPU s/GB (bulk, 1 stream)", testBulk1, "cpu_s_per_gb", f2, false},
		{"CPU µs/request (keep-alive)", testKeepAlive, "cpu_us_per_req", f1, false},
		{"CPU s/10k conns", testConnRate, "cpu_s_per_10k", f2, false},
		{fmt.Sprintf("RSS MiB, %s idle conns", fmtCount(r.Settings.IdleConnsWanted)), testIdle, "rss_mib_wanted", f0, false},
		{"RSS MiB, none", testIdle, "rss_base_mib", f0, false},
		{"RSS KiB per idle conn", testIdle, "rss_kib_per_conn", f1, false},
		{"idle conns held (of opened)", testIdle, "held", fInt, true},
		{"goroutines while idle conns held", testIdle, "goroutines", fInt, false},
	}
}

// udpColumns: the DNS test, at the peak and at 80 % of the mode's own peak.
var udpColumns = []column{
	{"peak queries/s", testUDP, "qps", fk, true},
	{"loss % at peak", testUDP, "loss_pct", f2, false},
	{"p99 ms at peak", testUDP, "p99_ms", f2, false},
	{"queries/s at 80 %", testUDP, "qps_at_80", fk, true},
	{"loss % at 80 %", testUDP, "loss_pct_at_80", f2, false},
	{"p99 ms at 80 %", testUDP, "p99_ms_at_80", f2, false},
	{"CPU µs/query", testUDP, "cpu_us_per_query", f1, false},
}

var ratioColumns = []column{
	{"bulk 1", testBulk1, "gbps", nil, true},
	{"bulk 4", testBulk4, "gbps", nil, true},
	{"keep-alive req/s", testKeepAlive, "rps", nil, true},
	{"p99 latency", testKeepAlive, "p99_ms", nil, false},
	{"new conn/s", testConnRate, "conn_per_s", nil, true},
	{"1 MiB/s", testMiB, "per_s", nil, true},
	{"CPU µs/req", testKeepAlive, "cpu_us_per_req", nil, false},
}

func (r *Results) cell(mode string, c column) string {
	st := r.stat(mode, c.test, c.metric)
	if !st.ok() {
		return "–"
	}
	return c.format(st.Median)
}

func (r *Results) markdown(charts map[string]barChart) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	m := r.Machine
	p("# svcproxy benchmark: %s\n\n", r.Started.UTC().Format("2006-01-02 15:04 UTC"))
	if r.Interrupted {
		p("**Interrupted**: the run was stopped before the end; the tables hold what was measured.\n\n")
	}
	p("%s preset: %d interleaved round(s) of %gs tests, medians shown (every sample in `results.json`). ", r.Settings.Preset, r.Settings.Rounds, r.Settings.DurationS)
	p("Machine: %s, %d cores, %.1f GiB, kernel %s, %s", m.CPU, m.Cores, m.MemoryGiB, m.Kernel, m.OS)
	if m.TCPCC != "" {
		p(", TCP congestion control %s", m.TCPCC)
	}
	p(". ")
	p("Load average at start %.2f / %.2f / %.2f, at end %.2f / %.2f / %.2f. ", m.LoadStart[0], m.LoadStart[1], m.LoadStart[2], m.LoadEnd[0], m.LoadEnd[1], m.LoadEnd[2])
	p("svcproxy: %s. Client, node (proxy) and backends share the %d cores.\n\n", m.Svcproxy, m.Cores)
	if r.Settings.Note != "" {
		p("Note: %s\n\n", r.Settings.Note)
	}
	p("Load generators: %s. HTTP backend: %s. Tools: %s.\n\n", r.generatorLine(), r.HTTPBackend, r.toolLine())
	maxLoad, maxAt := m.LoadStart[0], "the start"
	for _, l := range r.Loads {
		if l.Load1 > maxLoad {
			maxLoad, maxAt = l.Load1, fmt.Sprintf("round %d, %s", l.Round, l.Mode)
		}
	}
	p("Highest 1-minute load average seen as a mode's round began: %.2f (%s); the bench itself keeps about 2 busy while it runs, more is other work on the machine.\n\n", maxLoad, maxAt)
	if maxLoad > float64(m.Cores)+1 {
		p("**Other work loaded the machine during the run: absolute figures are depressed and noisy; ratios measured in the same run hold better.**\n\n")
	}

	ran := r.ranModes()
	p("## Data path\n\n")
	r.table(&b, ran, dataColumns, func(mode string) []string {
		rtx := "–"
		if st := r.stat(mode, testConnRate, "syn_retrans_client"); st.ok() {
			rtx = fmt.Sprintf("%s / %s", fInt(st.Median), fInt(r.med(mode, testConnRate, "syn_retrans_node")))
		}
		return []string{rtx}
	}, "SYN retransmits (client / node)")
	p("\nbulk: %s, client → backend0; keep-alive: 1 KiB responses over 64 connections; new conn/s: one request per connection (`Connection: close`, 64 concurrent; read the rate, not the latency); 1 MiB: 8 keep-alive connections. SYN retransmits are counted during the new-connection test in the client's and the node's namespaces.\n\n", r.Generators[testBulk1])

	p("## Proxy cost and resilience\n\n")
	r.table(&b, ran, r.costColumns(), func(mode string) []string {
		st := r.stat(mode, testFault, "failed")
		if !st.ok() {
			return []string{"–"}
		}
		cell := fmt.Sprintf("%s of %s: %s in flight, **%s after**", fInt(st.Median), fInt(r.med(mode, testFault, "requests")),
			fInt(r.med(mode, testFault, "failed_at_kill")), fInt(r.med(mode, testFault, "failed_after_kill")))
		var kinds []string
		for _, k := range r.metricsOf(mode, testFault, "failed_kind_") {
			kinds = append(kinds, fmt.Sprintf("%s %s", strings.ReplaceAll(strings.TrimPrefix(k, "failed_kind_"), "_", " "), fInt(r.med(mode, testFault, k))))
		}
		if len(kinds) > 0 {
			cell += " (" + strings.Join(kinds, ", ") + ")"
		}
		return []string{cell}
	}, "failed requests, 1 of 3 backends killed")
	p("\nCPU is user+system time of the proxy's processes from /proc/PID/stat over the test; the kernel modes' work happens in softirq and is charged to no process (–). ")
	if r.Settings.IdleConns < r.Settings.IdleConnsWanted {
		p("**RSS: this machine's open-files limit is %d and root cannot raise it here (no CAP_SYS_RESOURCE), and a proxy holds two descriptors per connection, so %s idle connections were opened, not %s; the RSS column adds the measured per-connection cost for the rest** (VmRSS summed over the proxy's processes). ", r.Settings.FileLimit, fmtCount(r.Settings.IdleConns), fmtCount(r.Settings.IdleConnsWanted))
	} else {
		p("RSS is VmRSS summed over the proxy's processes with %s idle connections open through it. ", fmtCount(r.Settings.IdleConns))
	}
	p("*Idle conns held*: connections the proxy still holds a second after the client opened %s of them, 32 at a time (two descriptors each); fewer means it dropped some of the burst. ", fmtCount(r.Settings.IdleConns))
	p("Fault: 8 workers, a new connection per request, %gs, the third backend's server SIGKILLed a third of the way in; no endpoint is removed during the run (the window before a control plane notices). *in flight*: connected and sent before the kill or within 50 ms of it, so possibly already on the dying backend, which no L4 proxy can save; *after*: the rest, new connections sent to the dead backend (a refused connect is always counted here), what retry on refusal prevents. In brackets, how they failed (*connect refused*: before a byte was sent).\n\n", r.Settings.FaultS)

	if udp := r.modesWith(ran, testUDP); len(udp) > 0 {
		p("## UDP (DNS)\n\n")
		r.table(&b, udp, udpColumns, nil, "")
		p("\ndnsperf from the client, 16 clients, up to 200 queries outstanding, one second to answer, against the dns Service: dnsmasq on each of the three backends answering from its own table. *Peak*: as fast as answers come; *at 80 %%*: dnsperf paced (-Q) at 80 %% of the mode's own peak, the load it should carry without loss. Loss: queries with no answer within the second. HAProxy has no UDP proxy (skipped); direct sends to backend0's dnsmasq alone.\n\n")
	}

	r.ratios(&b, ran)
	r.targets(&b)
	r.controlPlane(&b)
	r.vmSection(&b)
	r.syscallTable(&b)

	p("## Charts\n\n")
	names := make([]string, 0, len(charts))
	for n := range charts {
		names = append(names, n)
	}
	order := []string{"throughput.svg", "requests.svg", "latency.svg", "connrate.svg", "sync.svg", "change.svg"}
	sort.Slice(names, func(i, j int) bool { return slices.Index(order, names[i]) < slices.Index(order, names[j]) })
	for _, n := range names {
		p("![%s](%s)\n\n", charts[n].Title, n)
	}

	p("## Modes\n\n")
	for _, mr := range r.Modes {
		switch mr.Status {
		case "skipped":
			p("- **%s**: skipped: %s.\n", mr.Name, mr.Reason)
		default:
			status := ""
			if mr.Status == "failed" {
				status = " **FAILED**"
			}
			p("- **%s**%s: %s.", mr.Name, status, mr.Describe)
			for _, n := range uniq(mr.Notes) {
				p(" %s.", strings.TrimSuffix(n, "."))
			}
			p("\n")
			for _, e := range mr.Errors {
				p("  - error: %s\n", strings.ReplaceAll(e, "\n", " "))
			}
		}
	}
	p("\n")
	r.noise(&b, ran)
	p("## What is and is not comparable\n\n")
	for _, line := range r.caveats() {
		p("- %s\n", line)
	}
	return b.String()
}

// metricsOf lists the metrics of (mode, test) that start with prefix.
func (r *Results) metricsOf(mode, test, prefix string) []string {
	var out []string
	for _, s := range r.Samples {
		if s.Mode == mode && s.Test == test && strings.HasPrefix(s.Metric, prefix) && !slices.Contains(out, s.Metric) {
			out = append(out, s.Metric)
		}
	}
	sort.Strings(out)
	return out
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

func (r *Results) generatorLine() string {
	return fmt.Sprintf("bulk %s, HTTP %s, idle connections and fault test built-in Go", r.Generators[testBulk1], r.Generators[testKeepAlive])
}

func (r *Results) toolLine() string {
	var parts []string
	keys := make([]string, 0, len(r.Machine.Tools))
	for k := range r.Machine.Tools {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("`%s`", r.Machine.Tools[k]))
	}
	return strings.Join(parts, ", ")
}

// table writes one row per mode; extra adds trailing cells under extraHead.
func (r *Results) table(b *strings.Builder, modes []string, cols []column, extra func(string) []string, extraHead string) {
	b.WriteString("| mode |")
	for _, c := range cols {
		b.WriteString(" " + c.head + " |")
	}
	if extra != nil {
		b.WriteString(" " + extraHead + " |")
	}
	b.WriteString("\n|---|")
	for range cols {
		b.WriteString("---:|")
	}
	if extra != nil {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for _, m := range modes {
		name := m
		if m == "svcproxy-userspace" {
			name = "**" + m + "**"
		}
		b.WriteString("| " + name + " |")
		for _, c := range cols {
			b.WriteString(" " + r.cell(m, c) + " |")
		}
		if extra != nil {
			for _, x := range extra(m) {
				b.WriteString(" " + x + " |")
			}
		}
		b.WriteString("\n")
	}
}

func fmtRatio(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.2f×", v)
}

func (r *Results) ratios(b *strings.Builder, ran []string) {
	fmt.Fprintf(b, "## Ratios, same run\n\n")
	any := false
	for _, base := range baselines {
		if !slices.Contains(ran, base) {
			continue
		}
		any = true
		fmt.Fprintf(b, "Against **%s** (p99 latency and CPU: lower is better, so below 1× is better):\n\n| mode |", base)
		for _, c := range ratioColumns {
			fmt.Fprintf(b, " %s |", c.head)
		}
		b.WriteString("\n|---|" + strings.Repeat("---:|", len(ratioColumns)) + "\n")
		for _, m := range ran {
			if m == base {
				continue
			}
			fmt.Fprintf(b, "| %s |", m)
			for _, c := range ratioColumns {
				fmt.Fprintf(b, " %s |", fmtRatio(r.ratio(m, base, c)))
			}
			b.WriteString("\n")
		}
		b.WriteString("\n")
	}
	if !any {
		b.WriteString("No baseline mode (direct, kube-dnat, svcproxy-iptables) ran.\n\n")
	}
	if !slices.Contains(ran, "svcproxy-iptables") {
		b.WriteString("svcproxy-iptables did not run in this run (see Modes), so there are no ratios against it yet.\n\n")
	}
}

// target is one of the data path's goals (issue 11): svcproxy's userspace
// mode against the better of the two peer proxies in the same run.
type target struct {
	goal     string
	measured string
	rounds   string // a ratio's spread over the rounds; empty: not a ratio
	met      *bool  // nil: could not be judged
}

// perRound is a target's per-round ratios as "lo–hi×, met in k of n";
// empty when there are none.
func perRound(rs []float64, ok func(float64) bool) string {
	if len(rs) == 0 {
		return ""
	}
	met := 0
	for _, v := range rs {
		if ok(v) {
			met++
		}
	}
	return fmt.Sprintf("%.2f–%.2f×, met in %d of %d", slices.Min(rs), slices.Max(rs), met, len(rs))
}

// peers are the userspace proxies svcproxy's userspace mode is held to.
var peers = []string{"haproxy", "nginx-stream"}

func (r *Results) targets(b *strings.Builder) {
	ran := r.ranModes()
	for _, us := range []string{"svcproxy-vip", "svcproxy-local", "svcproxy-userspace"} {
		if slices.Contains(ran, us) {
			r.targetTable(b, us, ran)
		}
	}
}

func (r *Results) targetTable(b *strings.Builder, us string, ran []string) {
	judge := func(v float64, ok func(float64) bool) *bool {
		if math.IsNaN(v) {
			return nil
		}
		x := ok(v)
		return &x
	}
	col := func(test, metric string) column {
		for _, c := range append(slices.Clone(ratioColumns), r.costColumns()...) {
			if c.test == test && c.metric == metric {
				return c
			}
		}
		return column{test: test, metric: metric}
	}
	var ts []target
	// vsBetter: the ratio against the better peer on the column (the
	// smallest ratio where higher is better, the largest where lower is).
	vsBetter := func(goal, test, metric string, ok func(float64) bool) {
		c := col(test, metric)
		best, bestPeer := math.NaN(), ""
		for _, p := range peers {
			if !slices.Contains(ran, p) {
				continue
			}
			v := r.ratio(us, p, c)
			if math.IsNaN(v) {
				continue
			}
			if math.IsNaN(best) || (c.higherBetter && v < best) || (!c.higherBetter && v > best) {
				best, bestPeer = v, p
			}
		}
		m := fmtRatio(best)
		if bestPeer != "" {
			m += " (vs " + bestPeer + ")"
		}
		ts = append(ts, target{goal: goal, measured: m, rounds: perRound(r.roundRatios(us, bestPeer, c), ok), met: judge(best, ok)})
	}
	vsPeer := func(goal, peer, test, metric string, ok func(float64) bool) {
		c := col(test, metric)
		v := r.ratio(us, peer, c)
		ts = append(ts, target{goal: goal, measured: fmtRatio(v), rounds: perRound(r.roundRatios(us, peer, c), ok), met: judge(v, ok)})
	}
	vsBetter("keep-alive req/s ≥ 1.1× the better peer", testKeepAlive, "rps", func(v float64) bool { return v >= 1.1 })
	vsBetter("keep-alive p99 ≤ the better peer's", testKeepAlive, "p99_ms", func(v float64) bool { return v <= 1.0 })
	vsBetter("new connections/s ≥ the better peer", testConnRate, "conn_per_s", func(v float64) bool { return v >= 1.0 })
	vsBetter("CPU per 10k connections ≤ 0.9× the better peer", testConnRate, "cpu_s_per_10k", func(v float64) bool { return v <= 0.9 })
	vsBetter("CPU per keep-alive request ≤ 0.9× the better peer", testKeepAlive, "cpu_us_per_req", func(v float64) bool { return v <= 0.9 })
	sc := math.NaN()
	for _, p := range r.Syscalls {
		if p.Mode == us && p.Load == "keepalive" && p.Requests > 0 {
			sc = float64(p.Total) / float64(p.Requests)
		}
	}
	ts = append(ts, target{goal: "syscalls per keep-alive request ≤ 4 (strace)", measured: fmtOr(sc, f1, ""), met: judge(sc, func(v float64) bool { return v <= 4.05 })})
	vsPeer("1 MiB transfers/s ≥ HAProxy", "haproxy", testMiB, "per_s", func(v float64) bool { return v >= 1.0 })
	if slices.Contains(ran, us) && r.stat(us, testUDP, "qps").ok() {
		// Issue 15: UDP (DNS) beside nginx stream's UDP proxy.
		vsPeer("UDP (DNS) queries/s ≥ nginx stream", "nginx-stream", testUDP, "qps", func(v float64) bool { return v >= 1.0 })
		loss := r.med(us, testUDP, "loss_pct_at_80")
		ts = append(ts, target{goal: "UDP (DNS) loss ≤ 0.1 % at 80 % of its peak rate", measured: fmtOr(loss, f2, "") + " %", met: judge(loss, func(v float64) bool { return v <= 0.1 })})
	}
	vsPeer("bulk, 1 stream ≥ HAProxy", "haproxy", testBulk1, "gbps", func(v float64) bool { return v >= 1.0 })
	vsPeer("bulk, 4 streams ≥ HAProxy", "haproxy", testBulk4, "gbps", func(v float64) bool { return v >= 1.0 })
	vsPeer(fmt.Sprintf("RSS with %s idle connections ≤ 1.25× HAProxy's", fmtCount(r.Settings.IdleConnsWanted)), "haproxy", testIdle, "rss_mib_wanted", func(v float64) bool { return v <= 1.25 })
	g, held := r.med(us, testIdle, "goroutines"), r.med(us, testIdle, "held")
	ts = append(ts, target{goal: "no goroutine per connection (goroutines while the idle connections are held)",
		measured: fmtOr(g, fInt, "") + " with " + fmtOr(held, fInt, "") + " held", met: judge(g, func(v float64) bool { return v < 100 })})
	failed := r.med(us, testFault, "failed_after_kill")
	ts = append(ts, target{goal: "0 failed requests after a backend dies (retry on refusal; requests in flight on it excepted)", measured: fmtOr(failed, fInt, "") + fmt.Sprintf(" (%s in flight)", fmtOr(r.med(us, testFault, "failed_at_kill"), fInt, "")), met: judge(failed, func(v float64) bool { return v == 0 })})
	fmt.Fprintf(b, "## %s against the data path's targets (issue 11)\n\n", us)
	b.WriteString("*measured* is the ratio of the medians over the rounds; *per round* is the same ratio taken round by round (each round runs every mode back to back), its range and in how many rounds it alone would meet the target.\n\n")
	b.WriteString("| target | measured (same run) | per round | |\n|---|---|---|---|\n")
	missed := 0
	for _, t := range ts {
		verdict := "not judged (a mode it needs did not run)"
		switch {
		case t.met == nil:
		case *t.met:
			verdict = "met"
		default:
			verdict = "**missed**"
			missed++
		}
		rounds := t.rounds
		if rounds == "" {
			rounds = "–"
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", t.goal, t.measured, rounds, verdict)
	}
	if missed > 0 {
		fmt.Fprintf(b, "\n**%s misses %d of these targets in this run.**", us, missed)
		if len(r.Syscalls) > 0 {
			b.WriteString(" The syscall profile below shows where its time goes.")
		} else {
			b.WriteString(" `--full` (or `--syscalls`, `--perf`) profiles where its time goes.")
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

func fmtOr(v float64, f func(float64) string, unit string) string {
	if math.IsNaN(v) {
		return "–"
	}
	return f(v) + unit
}

func (r *Results) controlPlane(b *strings.Builder) {
	if len(r.ControlPlane) == 0 {
		return
	}
	b.WriteString("## Control plane\n\n")
	b.WriteString("Program N Services × 10 endpoints from scratch on a fresh node, then one endpoint change at a time at that scale, then one Service (10 endpoints) added at a time. *own*: the mode's programming alone (kube-dnat: the iptables-legacy-restore; svcproxy: from the store publishing the snapshot to the rules being live); *end to end*: also the source (kube-dnat: generating the rules; svcproxy: from process start / SIGHUP, reading and parsing the whole services file).\n\n")
	b.WriteString("| mode | Services × endpoints | program, own s | program, end to end s | change p50 ms, own | change p99 ms, own | change p50 ms, end to end | change p99 ms, end to end | changes | add a Service p50 ms, own | add p99 ms, own | adds |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range r.ControlPlane {
		if s.Error != "" {
			fmt.Fprintf(b, "| %s | %d | failed: %s | | | | | | | | | |\n", s.Mode, s.Services, strings.ReplaceAll(firstLine(s.Error), "|", "/"))
			continue
		}
		own, tot := slices.Sorted(slices.Values(s.ChangesMs)), slices.Sorted(slices.Values(s.ChangesTotalMs))
		adds := slices.Sorted(slices.Values(s.AddsMs))
		addP50, addP99 := "–", "–"
		if len(adds) > 0 {
			addP50, addP99 = fmtNum(median(adds)), fmtNum(percentile(adds, 99))
		}
		fmt.Fprintf(b, "| %s | %s × %d | %s | %s | %s | %s | %s | %s | %d | %s | %s | %d |\n", s.Mode, fmtCount(s.Services), s.Endpoints/max(1, s.Services),
			fmtNum(s.ProgramS), fmtNum(s.ProgramTotalS), fmtNum(median(own)), fmtNum(percentile(own, 99)), fmtNum(median(tot)), fmtNum(percentile(tot, 99)), len(own),
			addP50, addP99, len(adds))
	}
	b.WriteString("\n")
	for _, s := range r.ControlPlane {
		for _, n := range s.Notes {
			fmt.Fprintf(b, "- %s, %s Services: %s.\n", s.Mode, fmtCount(s.Services), strings.TrimSuffix(n, "."))
		}
	}
	b.WriteString("\n")
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

func fmtCount(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func (r *Results) syscallTable(b *strings.Builder) {
	if len(r.Syscalls) == 0 {
		return
	}
	b.WriteString("## Syscalls (strace -c -f on the proxy during 2 s of load, round 1)\n\n")
	b.WriteString("strace slows the proxy several-fold, so only counts per request and per MB mean anything here.\n\n")
	b.WriteString("| mode | keep-alive: syscalls per request | top calls per request | bulk: syscalls per MB | splice per MB | read/recv per MB | write/send per MB | splices bulk? |\n|---|---:|---|---:|---:|---:|---:|---|\n")
	modes := []string{}
	for _, p := range r.Syscalls {
		if !slices.Contains(modes, p.Mode) {
			modes = append(modes, p.Mode)
		}
	}
	defer func() {
		if len(r.Profiles) == 0 {
			return
		}
		b.WriteString("CPU profiles (`perf record -g`, 3 s, round 1), saved next to this file:\n\n")
		for _, p := range r.Profiles {
			fmt.Fprintf(b, "- %s, %s load: %.0f%% of its CPU samples in the kernel ([%s](%s))\n", p.Mode, p.Load, p.KernelPct, p.File, p.File)
		}
		b.WriteString("\n")
	}()
	for _, m := range modes {
		var ka, bulk *SyscallProfile
		for i := range r.Syscalls {
			p := &r.Syscalls[i]
			if p.Mode == m && p.Load == "keepalive" {
				ka = p
			}
			if p.Mode == m && p.Load == "bulk" {
				bulk = p
			}
		}
		cells := []string{"–", "–", "–", "–", "–", "–", "–"}
		if ka != nil && ka.Requests > 0 {
			n := float64(ka.Requests)
			cells[0] = fmt.Sprintf("%.1f", float64(ka.Total)/n)
			cells[1] = topCalls(ka.Calls, n, 5)
		}
		if bulk != nil && bulk.Bytes > 0 {
			mb := float64(bulk.Bytes) / 1e6
			sp := float64(bulk.Calls["splice"])
			rd := float64(bulk.Calls["read"] + bulk.Calls["recvfrom"] + bulk.Calls["recvmsg"] + bulk.Calls["readv"])
			wr := float64(bulk.Calls["write"] + bulk.Calls["sendto"] + bulk.Calls["sendmsg"] + bulk.Calls["writev"])
			cells[2] = fmt.Sprintf("%.1f", float64(bulk.Total)/mb)
			cells[3] = fmt.Sprintf("%.1f", sp/mb)
			cells[4] = fmt.Sprintf("%.1f", rd/mb)
			cells[5] = fmt.Sprintf("%.1f", wr/mb)
			switch {
			case sp > 0 && sp >= rd:
				cells[6] = "yes"
			case sp > 0:
				cells[6] = "partly"
			default:
				cells[6] = "**no**"
			}
		}
		fmt.Fprintf(b, "| %s | %s |\n", m, strings.Join(cells, " | "))
	}
	b.WriteString("\n")
}

func topCalls(calls map[string]int64, per float64, n int) string {
	type kv struct {
		k string
		v int64
	}
	var all []kv
	for k, v := range calls {
		all = append(all, kv{k, v})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v || (all[i].v == all[j].v && all[i].k < all[j].k) })
	var parts []string
	for i := 0; i < n && i < len(all); i++ {
		parts = append(parts, fmt.Sprintf("%s %.2f", all[i].k, float64(all[i].v)/per))
	}
	return strings.Join(parts, ", ")
}

// noise lists the figures whose rounds disagreed by more than 15%.
func (r *Results) noise(b *strings.Builder, ran []string) {
	if r.Settings.Rounds < 2 {
		b.WriteString("## Noise\n\nOne round only: no spread across rounds to report (use --full or --rounds 3).\n\n")
		return
	}
	var lines []string
	for _, m := range ran {
		var parts []string
		for _, c := range append(append(slices.Clone(dataColumns), r.costColumns()...), udpColumns...) {
			st := r.stat(m, c.test, c.metric)
			if st.N >= 2 && st.spread() > 0.15 {
				parts = append(parts, fmt.Sprintf("%s %s–%s", c.head, c.format(st.Min), c.format(st.Max)))
			}
		}
		if len(parts) > 0 {
			lines = append(lines, fmt.Sprintf("**%s**: %s", m, strings.Join(parts, "; ")))
		}
	}
	if len(lines) == 0 {
		b.WriteString("## Noise\n\nEvery figure above agreed within 15% across rounds.\n\n")
		return
	}
	b.WriteString("## Noise\n\nFigures whose rounds disagreed by more than 15% of their median (min–max over the rounds; the load averages per round are in `results.json`):\n\n")
	for _, l := range lines {
		b.WriteString("- " + l + "\n")
	}
	b.WriteString("\n")
}

func (r *Results) caveats() []string {
	c := []string{
		"Everything shares 2 cores: the load generator, the proxy and the backend compete, so a mode that uses less CPU leaves more to the others. Ratios taken in the same run are the figures to compare; absolute numbers move with the machine's load.",
		"direct, kube-dnat and svcproxy's kernel modes (svcproxy-iptables, svcproxy-nftables) have no proxy process on the data path: their CPU is spent in softirq and charged to no process, so their CPU and RSS cells are empty, not zero.",
		"A proxy's CPU is its processes' user and system time: its own code, the TCP work of its two sockets per connection and, because a veth delivers a packet in the sender's context, part of the receiving namespace's softirq work. That is the same for every proxy, so proxies compare with each other; none of it compares with the kernel modes' uncharged CPU.",
		"kube-dnat is kube-proxy's rule shape loaded by the bench, not kube-proxy: no informers, no change tracking, no conntrack cleanup. Its control-plane figures are iptables-legacy-restore alone (plus rule generation in Go for end to end). With the nf_tables backend (this node's default `iptables`) kube-proxy's iptables mode did not finish a 5,000-Service restore in 15 minutes (FACTS.md), so the legacy backend is the only one that gives kube-dnat figures at scale.",
		"svcproxy-userspace steers with its own nftables table (--steering-backend=nftables: fixed rules redirecting through a frontend→port map, over netlink); svcproxy-userspace-ipset is the same userspace mode steered by one REDIRECT rule over ipsets (--steering-backend=iptables), so the two compare the steering backends alone. svcproxy-userspace-ipset and svcproxy-iptables use the node's default iptables (nf_tables here; svcproxy-iptables DNAT chains); svcproxy-nftables writes its own nftables table (fixed rules over sets and maps) over netlink, with no iptables backend involved; kube-dnat uses iptables-legacy, the only backend at which kube-proxy-shaped rules program 10,000 Services in minutes. Control-plane times of svcproxy-iptables and kube-dnat therefore compare two designs on two backends, not one; svcproxy-nftables against svcproxy-iptables compares two designs on the same kernel's nf_tables.",
		"svcproxy's control-plane end-to-end figures include its static-file source (re-reading and parsing the whole YAML file on every change); with a Kubernetes source only the changed EndpointSlice would be processed. Its *own* figures are the comparable ones.",
		"HAProxy and nginx listen on the VIP (added to the node's lo); svcproxy and kube-dnat steer the VIP with netfilter. Peers are configured as described under Modes (configs saved next to this file); they are not tuned beyond that.",
		"The keep-alive test's p99 is wrk's latency (without connection set-up). The new-connection test's latency is not reported: wrk does not time the handshake.",
		"The fault test and the idle-connection test always use the built-in Go client; so does every test when wrk or iperf3 is missing (the Load generators line says which ran).",
	}
	if vc := r.vmCaveat(); vc != "" {
		c = append(c, vc)
	}
	c = append(c, "kube-dnat masquerades only connections from outside the cluster CIDR (198.18.1.0/24, the client namespace), as kube-proxy does with a cluster CIDR: the client \"pod\"'s connections are DNATed, not SNATed. kube-dnat-masq masquerades every one (kube-proxy's --masquerade-all; the same as any NodePort or external client with externalTrafficPolicy Cluster): the backend then sees the node's address, and a source port still in TIME_WAIT on the backend costs a SYN retransmit (1 s), which the SYN-retransmit column counts.")
	return c
}

// charts builds every chart of the run.
func (r *Results) charts() map[string]barChart {
	ran := r.ranModes()
	out := map[string]barChart{}
	if len(ran) == 0 {
		return out
	}
	colors := make([]string, len(ran))
	for i, m := range ran {
		colors[i] = modeColor(m)
	}
	series := func(name string, color string, test, metric string) barSeries {
		s := barSeries{Name: name, Color: color}
		for _, m := range ran {
			st := r.stat(m, test, metric)
			if !st.ok() {
				s.Values, s.Lo, s.Hi = append(s.Values, math.NaN()), append(s.Lo, math.NaN()), append(s.Hi, math.NaN())
				continue
			}
			s.Values, s.Lo, s.Hi = append(s.Values, st.Median), append(s.Lo, st.Min), append(s.Hi, st.Max)
		}
		return s
	}
	sub := fmt.Sprintf("median of %d round(s); whiskers: min–max", r.Settings.Rounds)

	// Throughput: groups are the tests, one bar per mode.
	tp := barChart{Title: "Throughput", Subtitle: sub, YLabel: "Gbit/s", Groups: []string{"bulk, 1 stream", "bulk, 4 streams", "1 MiB transfers"}}
	for _, m := range ran {
		s := barSeries{Name: m, Color: modeColor(m)}
		for _, tm := range [][2]string{{testBulk1, "gbps"}, {testBulk4, "gbps"}, {testMiB, "gbps"}} {
			st := r.stat(m, tm[0], tm[1])
			v, lo, hi := math.NaN(), math.NaN(), math.NaN()
			if st.ok() {
				v, lo, hi = st.Median, st.Min, st.Max
			}
			s.Values, s.Lo, s.Hi = append(s.Values, v), append(s.Lo, lo), append(s.Hi, hi)
		}
		tp.Series = append(tp.Series, s)
	}
	out["throughput.svg"] = tp

	ka := series("keep-alive req/s", "#1f77b4", testKeepAlive, "rps")
	ka.Colors = colors
	out["requests.svg"] = barChart{Title: "Keep-alive requests/s (1 KiB responses, 64 connections)", Subtitle: sub, YLabel: "requests/s", Groups: ran, Series: []barSeries{ka}}

	lat := barChart{Title: "Keep-alive latency percentiles", Subtitle: "median over rounds of each percentile (wrk, 64 connections)", YLabel: "ms", Groups: ran}
	for _, p := range []struct{ name, metric, color string }{{"p50", "p50_ms", "#9ecae1"}, {"p90", "p90_ms", "#4292c6"}, {"p99", "p99_ms", "#08519c"}} {
		s := series(p.name, p.color, testKeepAlive, p.metric)
		s.Lo, s.Hi = nil, nil
		lat.Series = append(lat.Series, s)
	}
	out["latency.svg"] = lat

	cr := series("new conn/s", "#1f77b4", testConnRate, "conn_per_s")
	cr.Colors = colors
	notes := make([]string, len(ran))
	for i, m := range ran {
		if st := r.stat(m, testConnRate, "syn_retrans_client"); st.ok() {
			notes[i] = fmt.Sprintf("SYN rtx %s / %s", fInt(st.Median), fInt(r.med(m, testConnRate, "syn_retrans_node")))
		}
	}
	out["connrate.svg"] = barChart{Title: "New connections per second (one request each)", Subtitle: sub + "; SYN retransmits client / node under each mode", YLabel: "connections/s", Groups: ran, GroupNotes: notes, Series: []barSeries{cr}}

	// Control plane, by Service count.
	var scales []int
	var cpModes []string
	for _, s := range r.ControlPlane {
		if s.Error != "" {
			continue
		}
		if !slices.Contains(scales, s.Services) {
			scales = append(scales, s.Services)
		}
		if !slices.Contains(cpModes, s.Mode) {
			cpModes = append(cpModes, s.Mode)
		}
	}
	slices.Sort(scales)
	if len(scales) > 0 {
		groups := make([]string, len(scales))
		for i, n := range scales {
			groups[i] = fmtCount(n) + " Services × 10"
		}
		sync := barChart{Title: "Programming every Service from scratch", Subtitle: "the mode's own work (log scale)", YLabel: "seconds", Groups: groups, Log: true}
		change := barChart{Title: "One endpoint change at scale", Subtitle: "the mode's own work; bar: median, whisker: min–p99 (log scale)", YLabel: "milliseconds", Groups: groups, Log: true}
		for _, m := range cpModes {
			ss := barSeries{Name: m, Color: modeColor(m)}
			cs := barSeries{Name: m, Color: modeColor(m)}
			for _, n := range scales {
				v, cv, lo, hi := math.NaN(), math.NaN(), math.NaN(), math.NaN()
				for _, s := range r.ControlPlane {
					if s.Mode == m && s.Services == n && s.Error == "" {
						v = s.ProgramS
						own := slices.Sorted(slices.Values(s.ChangesMs))
						if len(own) > 0 {
							cv, lo, hi = median(own), own[0], percentile(own, 99)
						}
					}
				}
				ss.Values = append(ss.Values, v)
				cs.Values, cs.Lo, cs.Hi = append(cs.Values, cv), append(cs.Lo, lo), append(cs.Hi, hi)
			}
			sync.Series = append(sync.Series, ss)
			change.Series = append(change.Series, cs)
		}
		out["sync.svg"] = sync
		out["change.svg"] = change
	}
	return out
}

// modesWith is the modes of ran with samples of test.
func (r *Results) modesWith(ran []string, test string) []string {
	var out []string
	for _, m := range ran {
		for _, s := range r.Samples {
			if s.Mode == m && s.Test == test {
				out = append(out, m)
				break
			}
		}
	}
	return out
}
