package main

import (
	"encoding/xml"
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/source/file"
)

func TestParseWrk(t *testing.T) {
	out := []byte(`Running 2s test @ http://198.19.0.10:80/1k
  2 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.10ms  400.00us   9.00ms   80.00%
BENCHJSON {"requests":50000,"duration_us":2000000,"bytes":60000000,"connect":0,"read":3,"write":0,"status":1,"timeout":0,"p50":950,"p90":1500,"p99":3200,"p999":7000,"max":9000}
Requests/sec:  25000.00
`)
	l, err := parseWrk(out)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.rate(); got != 25000 {
		t.Errorf("rate %v, want 25000", got)
	}
	if l.P50 != 950*time.Microsecond || l.P99 != 3200*time.Microsecond || l.Max != 9*time.Millisecond {
		t.Errorf("percentiles p50 %v p99 %v max %v", l.P50, l.P99, l.Max)
	}
	if l.errorCount() != 4 || l.Errors["read"] != 3 || l.Errors["status"] != 1 {
		t.Errorf("errors %v, want read 3, status 1", l.Errors)
	}
	if _, err := parseWrk([]byte("unable to connect to 198.19.0.10:80 Connection refused\n")); err == nil {
		t.Error("parseWrk accepted output without a summary")
	}
}

func TestParseIperf(t *testing.T) {
	b, err := parseIperf([]byte(`{"start":{},"intervals":[],"end":{"sum_sent":{"bytes":2600000000,"seconds":2.0,"retransmits":7},"sum_received":{"bytes":2500000000,"seconds":2.0}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if b.Bytes != 2500000000 || b.Retransmits != 7 || math.Abs(b.gbps()-10) > 1e-9 {
		t.Errorf("got %+v (%.2f Gbit/s), want the received 2.5 GB in 2 s = 10 Gbit/s, 7 retransmits", b, b.gbps())
	}
	if _, err := parseIperf([]byte(`{"error":"unable to connect to server: Connection refused"}`)); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("got %v, want iperf3's error", err)
	}
}

func TestParseStraceSummary(t *testing.T) {
	calls, total := parseStraceSummary(`% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 71.05    0.452213           4    100000     20000 splice
 20.00    0.120000           8     15000           epoll_pwait
  8.95    0.050000          10      5000           futex
------ ----------- ----------- --------- --------- ----------------
100.00    0.622213           5    120000     20000 total
`)
	if calls["splice"] != 100000 || calls["epoll_pwait"] != 15000 || calls["futex"] != 5000 || total != 120000 {
		t.Errorf("got %v total %d", calls, total)
	}
}

func TestParseStat(t *testing.T) {
	s, err := parseStat("4242 (nginx: worker (x)) S 4241 4241 4241 0 -1 4194624 100 0 0 0 1234 567 0 0 20 0 1 0 100 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0")
	if err != nil {
		t.Fatal(err)
	}
	if s.ppid != 4241 || s.utime != 1234 || s.stime != 567 {
		t.Errorf("got %+v, want ppid 4241, utime 1234, stime 567", s)
	}
}

func TestSNMPValue(t *testing.T) {
	text := "Tcp: RtoAlgorithm RtoMin RetransSegs InErrs\nTcp: 1 200 42 0\nUdp: InDatagrams\nUdp: 5\n"
	if v, err := snmpValue(text, "Tcp", "RetransSegs"); err != nil || v != 42 {
		t.Errorf("got %d, %v, want 42", v, err)
	}
	if _, err := snmpValue(text, "TcpExt", "TCPSynRetrans"); err == nil {
		t.Error("found a counter that is not there")
	}
}

func TestServicesYAMLParses(t *testing.T) {
	web := netip.MustParseAddr("198.18.2.1")
	services := []SvcPort{
		{Namespace: "bench", Service: "web", PortName: "http", VIP: webVIP, Port: 80, Endpoints: []netip.AddrPort{netip.AddrPortFrom(web, 80)}},
		{Namespace: "bench", Service: "web", PortName: "iperf", VIP: webVIP, Port: 5201, Endpoints: []netip.AddrPort{netip.AddrPortFrom(web, 5201)}},
	}
	services = append(services, genServices(30, 10)...)
	got, err := file.Parse(servicesYAML(services))
	if err != nil {
		t.Fatalf("svcproxy rejects the bench's services file: %v\n%s", err, servicesYAML(services))
	}
	if len(got) != len(services) {
		t.Errorf("svcproxy reads %d service ports, want %d", len(got), len(services))
	}
}

func TestGenChangesApplyInOrder(t *testing.T) {
	services := genServices(7, 3)
	seen := map[netip.AddrPort]bool{}
	for _, ch := range genChanges(services, 25) {
		replaceEndpoint(&services[ch.Service], ch) // panics if Old is not there
		if seen[ch.New] {
			t.Errorf("new endpoint %s used twice", ch.New)
		}
		seen[ch.New] = true
	}
	if len(genServices(60000, 1)) != 60000 {
		t.Error("60,000 Services do not fit the VIP range")
	}
}

func TestKubeRulesShape(t *testing.T) {
	services := genServices(2, 3)
	k := kubeRules{clusterCIDR: clusterCIDR}
	full := k.full(services)
	for _, want := range []string{
		"-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
		"-d " + services[0].VIP.String() + "/32 --dport 80 -j " + svcChain(services[0]),
		"--dport 80 ! -s 198.18.1.0/24 -j KUBE-MARK-MASQ",
		"--probability 0.3333333333 -j " + sepChain(services[0], services[0].Endpoints[0]),
		"--probability 0.5000000000 -j " + sepChain(services[0], services[0].Endpoints[1]),
		"-j DNAT --to-destination " + services[1].Endpoints[2].String(),
		"-j MASQUERADE --random-fully",
		"*filter\n",
	} {
		if !strings.Contains(full, want) {
			t.Errorf("full sync lacks %q", want)
		}
	}
	if n := strings.Count(full, "COMMIT\n"); n != 2 {
		t.Errorf("%d COMMITs, want 2 (nat, filter)", n)
	}
	// The last endpoint is unconditional.
	if strings.Contains(full, "--probability 1.0000000000") {
		t.Error("the last endpoint has a probability")
	}
	old := services[1]
	old.Endpoints = append([]netip.AddrPort(nil), old.Endpoints...)
	ch := EndpointChange{Service: 1, Old: old.Endpoints[1], New: netip.MustParseAddrPort("198.18.200.1:8080")}
	replaceEndpoint(&services[1], ch)
	part := k.partial(services, 1, old)
	if !strings.Contains(part, "-X "+sepChain(old, ch.Old)+"\n") {
		t.Errorf("partial sync does not delete the stale endpoint chain:\n%s", part)
	}
	if strings.Contains(part, "-A PREROUTING") {
		t.Error("partial sync adds the jumps again")
	}
	if strings.Contains(part, svcChain(services[0])+" -m comment") {
		t.Error("partial sync rewrites an unchanged Service's chain")
	}
	if !strings.Contains(part, "-j "+svcChain(services[0])) {
		t.Error("partial sync does not rewrite KUBE-SERVICES whole")
	}
	if got := svcChain(SvcPort{Namespace: "ns", Service: "svc", PortName: "p"}); len(got) != len("KUBE-SVC-")+16 {
		t.Errorf("chain name %q: want KUBE-SVC- and 16 characters", got)
	}
}

func TestChartSVG(t *testing.T) {
	for _, c := range []barChart{
		{Title: "T & <x>", YLabel: "Gbit/s", Groups: []string{"a", "b"}, Series: []barSeries{
			{Name: "m1", Color: "#000", Values: []float64{1, math.NaN()}, Lo: []float64{0.5, math.NaN()}, Hi: []float64{2, math.NaN()}},
			{Name: "m2", Color: "#111", Values: []float64{3, 4}},
		}},
		{Title: "log", Groups: []string{"1,000"}, Log: true, Series: []barSeries{{Name: "s", Values: []float64{0.004}}, {Name: "t", Values: []float64{13.8}}}},
		{Title: "empty", Groups: []string{"x"}, Series: []barSeries{{Name: "s", Values: []float64{math.NaN()}}}},
	} {
		svg := c.SVG()
		d := xml.NewDecoder(strings.NewReader(svg))
		for {
			_, err := d.Token()
			if err != nil {
				if err.Error() != "EOF" {
					t.Errorf("%s: not well-formed XML: %v\n%s", c.Title, err, svg)
				}
				break
			}
		}
	}
}

func TestFmtNum(t *testing.T) {
	for _, tc := range []struct {
		in   float64
		want string
	}{{55200, "55.2k"}, {1500, "1.5k"}, {23.04, "23"}, {0.31, "0.31"}, {2400000, "2.4M"}, {0, "0"}, {150, "150"}} {
		if got := fmtNum(tc.in); got != tc.want {
			t.Errorf("fmtNum(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestReportFromSamples(t *testing.T) {
	r := &Results{Settings: Settings{Rounds: 2, IdleConns: 9250, IdleConnsWanted: 10000}, Machine: Machine{Cores: 2}}
	for _, m := range []string{"direct", "svcproxy-userspace", "kube-dnat", "nginx-stream"} {
		r.Modes = append(r.Modes, &ModeResult{Name: m, Status: "ran"})
		for round := 1; round <= 2; round++ {
			for _, c := range dataColumns {
				r.add(Sample{Round: round, Mode: m, Test: c.test, Metric: c.metric, Value: float64(round) * 10})
			}
		}
	}
	r.Modes = append(r.Modes, &ModeResult{Name: "svcproxy-ipvs", Status: "skipped", Reason: "no IPVS"})
	r.add(Sample{Round: 1, Mode: "svcproxy-userspace", Test: testIdle, Metric: "rss_mib_wanted", Value: 120})
	r.ControlPlane = []CPSample{{Mode: "kube-dnat", Services: 1000, Endpoints: 10000, ProgramS: 1.5, ChangesMs: []float64{200, 300, 250}, ChangesTotalMs: []float64{210, 310, 260}, AddsMs: []float64{5, 7}}}
	md := r.markdown(r.charts())
	for _, want := range []string{"| **svcproxy-userspace** | 15.0 |", "Against **kube-dnat**", "svcproxy-userspace against the data path's targets", "keep-alive req/s ≥ 1.1× the better peer | 1.00× (vs nginx-stream) | 1.00–1.00×, met in 0 of 2 | **missed**", "syscalls per keep-alive request ≤ 4 (strace) | – | – |", "svcproxy-ipvs**: skipped: no IPVS", "| kube-dnat | 1,000 × 10 | 1.5 |", "| 3 | 6 | 7 | 2 |"} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md lacks %q:\n%s", want, md)
		}
	}
}

func TestControlPlaneOf(t *testing.T) {
	for _, tc := range []struct {
		m    Mode
		want bool
	}{
		{svcproxyMode{name: "svcproxy-userspace"}, true},
		{svcproxyMode{name: "svcproxy-userspace-ipset", steeringBackend: "iptables"}, true},
		{svcproxyMode{name: "svcproxy-iptables", kernelMode: "iptables"}, true},
		{svcproxyMode{name: "svcproxy-nftables", kernelMode: "nftables"}, true},
		{svcproxyMode{name: "svcproxy-vip", onVIP: true}, false}, // no rules to wait for
		{svcproxyMode{name: "svcproxy-local", local: true}, false},
		{&kubeDNATMode{}, true},
		{haproxyMode{}, false},
	} {
		if _, got := controlPlaneOf(tc.m); got != tc.want {
			t.Errorf("%s: measured by the control-plane test %v, want %v", tc.m.Name(), got, tc.want)
		}
	}
}

func TestClip(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"0123456789abc", 10, "0123456789… (3 more bytes)"},
		{"ééé", 3, "é… (3 more bytes)"}, // never half a rune
	} {
		if got := clip(tc.in, tc.n); got != tc.want {
			t.Errorf("clip(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

// TestNFTablesMode checks svcproxy-nftables is a mode of the bench like
// svcproxy-iptables: named by --modes, in the default run (so in make bench
// and --full), run with --proxy-mode=nftables, its rules awaited on the
// "synced" log line, charted in a colour of its own and counted as a
// kernel data path (no proxy process to profile).
func TestNFTablesMode(t *testing.T) {
	c, err := parseFlags([]string{"--modes", "direct,svcproxy-nftables"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"direct", "svcproxy-nftables"}; !slices.Equal(c.Modes, want) {
		t.Errorf("--modes: %v, want %v", c.Modes, want)
	}
	for _, preset := range [][]string{nil, {"--quick"}, {"--full"}} {
		c, err := parseFlags(preset)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.withDefaults().Modes; !slices.Contains(got, "svcproxy-nftables") || !slices.Contains(got, "svcproxy-iptables") {
			t.Errorf("%v: modes %v lack svcproxy-nftables or svcproxy-iptables", preset, got)
		}
	}
	m, ok := modeByName("svcproxy-nftables").(svcproxyMode)
	if !ok || m.kernelMode != "nftables" {
		t.Fatalf("svcproxy-nftables is %#v, want svcproxyMode with kernelMode nftables", modeByName("svcproxy-nftables"))
	}
	if !kernelDataPath(m) || kernelDataPath(modeByName("svcproxy-userspace")) || kernelDataPath(haproxyMode{}) {
		t.Error("kernelDataPath: want svcproxy-nftables a kernel data path, svcproxy-userspace and haproxy not")
	}
	if d := m.Describe(); !strings.Contains(d, "--proxy-mode=nftables") {
		t.Errorf("Describe: %q does not say --proxy-mode=nftables", d)
	}
	if !live(logEvent{Msg: "synced"}) {
		t.Error(`the nftables mode's "synced" is not taken as live`)
	}
	if modeColor("svcproxy-nftables") == modeColor("svcproxy-iptables") || modeColor("svcproxy-nftables") == modeColor("no such mode") {
		t.Error("svcproxy-nftables has no colour of its own")
	}
}

// TestUserspaceSteeringModes checks the control-plane rows "--steering=redirect
// on nftables vs on iptables + ipset": svcproxy-userspace asks for the
// nftables steering backend and svcproxy-userspace-ipset for iptables
// explicitly (a binary without --steering-backend gets neither flag:
// svcproxy-userspace runs its iptables steering, svcproxy-userspace-ipset
// is skipped), both are named by --modes and in every preset's default
// run, both are userspace data paths with a colour of their own, and the
// "applied" line each backend logs counts as live unless it carries an
// error (a failed write is retried; its rules are not in the kernel).
func TestUserspaceSteeringModes(t *testing.T) {
	c, err := parseFlags([]string{"--modes", "svcproxy-userspace,svcproxy-userspace-ipset", "--tests", "control"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"svcproxy-userspace", "svcproxy-userspace-ipset"}; !slices.Equal(c.Modes, want) {
		t.Errorf("--modes: %v, want %v", c.Modes, want)
	}
	for _, preset := range [][]string{nil, {"--quick"}, {"--full"}} {
		c, err := parseFlags(preset)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.withDefaults().Modes; !slices.Contains(got, "svcproxy-userspace") || !slices.Contains(got, "svcproxy-userspace-ipset") {
			t.Errorf("%v: modes %v lack svcproxy-userspace or svcproxy-userspace-ipset", preset, got)
		}
	}
	has := func(flags ...string) func(string) bool {
		return func(f string) bool { return slices.Contains(flags, f) }
	}
	for _, tc := range []struct {
		mode     string
		has      func(string) bool
		want     string // a flag args must hold; "" none of --steering-backend
		describe string
	}{
		{"svcproxy-userspace", has("steering-backend"), "--steering-backend=nftables", "--steering-backend=nftables"},
		{"svcproxy-userspace-ipset", has("steering-backend"), "--steering-backend=iptables", "--steering-backend=iptables"},
		{"svcproxy-userspace", has(), "", "nftables"},
	} {
		m, ok := modeByName(tc.mode).(svcproxyMode)
		if !ok {
			t.Fatalf("%s is %#v, want a svcproxyMode", tc.mode, modeByName(tc.mode))
		}
		args := m.argsFor(tc.has, "services.yaml")
		if !slices.Contains(args, "--steering=redirect") {
			t.Errorf("%s: args %v lack --steering=redirect", tc.mode, args)
		}
		backendFlags := slices.DeleteFunc(slices.Clone(args), func(a string) bool { return !strings.HasPrefix(a, "--steering-backend") })
		if tc.want == "" && len(backendFlags) > 0 || tc.want != "" && !slices.Equal(backendFlags, []string{tc.want}) {
			t.Errorf("%s: --steering-backend flags %v, want %q", tc.mode, backendFlags, tc.want)
		}
		if d := m.Describe(); !strings.Contains(d, tc.describe) {
			t.Errorf("%s: Describe %q does not say %s", tc.mode, d, tc.describe)
		}
		if kernelDataPath(m) {
			t.Errorf("%s counted as a kernel data path", tc.mode)
		}
	}
	if modeColor("svcproxy-userspace-ipset") == modeColor("svcproxy-userspace") || modeColor("svcproxy-userspace-ipset") == modeColor("no such mode") {
		t.Error("svcproxy-userspace-ipset has no colour of its own")
	}
	for _, tc := range []struct {
		ev   logEvent
		want bool
	}{
		{logEvent{Msg: "applied", Version: 3}, true}, // either steering backend, the IPVS mode
		{logEvent{Msg: "synced", Version: 3}, true},
		{logEvent{Msg: "applied", Version: 3, Error: "updating the IPv4 steering table: invalid argument"}, false},
		{logEvent{Msg: "synced", Version: 3, Error: "iptables-restore: exit status 1"}, false},
		{logEvent{Msg: "loaded services", Version: 3}, false},
	} {
		if got := live(tc.ev); got != tc.want {
			t.Errorf("live(%+v) = %v, want %v", tc.ev, got, tc.want)
		}
	}
}

// TestSockmapMode: svcproxy-sockmap runs svcproxy-userspace's command
// line plus --offload=sockmap, is a data-path mode only (no control-plane
// rows: its programming is svcproxy-userspace's), not a kernel data path,
// and has a colour of its own.
func TestSockmapMode(t *testing.T) {
	has := func(f string) bool { return f == "steering-backend" || f == "offload" }
	user, ok1 := modeByName("svcproxy-userspace").(svcproxyMode)
	sm, ok2 := modeByName("svcproxy-sockmap").(svcproxyMode)
	if !ok1 || !ok2 {
		t.Fatalf("svcproxy-userspace %#v, svcproxy-sockmap %#v: want svcproxyModes", modeByName("svcproxy-userspace"), modeByName("svcproxy-sockmap"))
	}
	want := append(user.argsFor(has, "s.yaml"), "--offload=sockmap")
	if got := sm.argsFor(has, "s.yaml"); !slices.Equal(got, want) {
		t.Errorf("args:\ngot  %v\nwant %v", got, want)
	}
	if _, ok := controlPlaneOf(sm); ok {
		t.Error("svcproxy-sockmap has control-plane rows")
	}
	if kernelDataPath(sm) {
		t.Error("svcproxy-sockmap counted as a kernel data path")
	}
	if c := modeColor("svcproxy-sockmap"); c == modeColor("svcproxy-userspace") || c == modeColor("no such mode") {
		t.Error("svcproxy-sockmap has no colour of its own")
	}
}

func TestRoundRatios(t *testing.T) {
	c := column{test: testKeepAlive, metric: "rps"}
	s := func(round int, mode string, v float64) Sample {
		return Sample{Round: round, Mode: mode, Test: c.test, Metric: c.metric, Value: v}
	}
	for _, tc := range []struct {
		name    string
		samples Samples
		want    []float64
		summary string
	}{
		{"paired by round, not by order", Samples{s(2, "b", 40), s(1, "a", 10), s(1, "b", 20), s(2, "a", 50)}, []float64{0.5, 1.25}, "0.50–1.25×, met in 1 of 2"},
		{"a round the base missed is left out", Samples{s(1, "a", 10), s(1, "b", 10), s(2, "a", 30)}, []float64{1}, "1.00–1.00×, met in 0 of 1"},
		{"a zero base is left out", Samples{s(1, "a", 10), s(1, "b", 0), s(2, "a", 30), s(2, "b", 20)}, []float64{1.5}, "1.50–1.50×, met in 1 of 1"},
		{"other metrics do not pair", Samples{s(1, "a", 10), {Round: 1, Mode: "b", Test: c.test, Metric: "p99_ms", Value: 5}}, nil, ""},
	} {
		got := tc.samples.roundRatios("a", "b", c)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: roundRatios = %v, want %v", tc.name, got, tc.want)
		}
		if sum := perRound(got, func(v float64) bool { return v >= 1.1 }); sum != tc.summary {
			t.Errorf("%s: perRound = %q, want %q", tc.name, sum, tc.summary)
		}
	}
}
