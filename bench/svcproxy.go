package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/redirect/steertable"
)

// svcproxyMode runs the real svcproxy binary on the node: the userspace
// mode with REDIRECT steering, or one of its kernel modes (--proxy-mode).
type svcproxyMode struct {
	name string
	// kernelMode is "" for the userspace mode, else the --proxy-mode value
	// ("iptables", "ipvs", "nftables").
	kernelMode string
	// steeringBackend is the userspace mode's --steering-backend:
	// "iptables" (iptables + ipset); "": nftables, given explicitly when
	// the binary has the flag (older ones steer with iptables + ipset).
	steeringBackend string
	// onVIP runs the userspace mode on the peers' footing: listening on the
	// VIPs put on the node's lo, no steering rules, no connection log.
	onVIP bool
	// local runs the userspace mode with --steering=local: svcproxy puts
	// the VIPs on its own dummy interface and listens on them; no steering
	// rules, no connection log. The peers' footing, deployable.
	local bool
	// offload is the userspace mode's --offload value ("": the flag not
	// given): svcproxy-sockmap is svcproxy-userspace with the kernel
	// moving established connections' bytes.
	offload string
}

func (m svcproxyMode) Name() string { return m.name }

// steering is the --steering-backend the userspace mode asks for.
func (m svcproxyMode) steering() string {
	if m.steeringBackend != "" {
		return m.steeringBackend
	}
	return "nftables"
}

// steeringPrefix starts svcproxy's start-up line saying what steers
// ("steering with nftables (table svcproxy-steering)", "steering with
// iptables (nf_tables) + ipset"; before --steering-backend, "steering with
// iptables REDIRECT").
const steeringPrefix = "steering with "

func (m svcproxyMode) Describe() string {
	if m.onVIP {
		return "svcproxy, userspace mode listening on the VIPs (on the node's lo) as the peer proxies do: no steering rules, --conn-log off"
	}
	if m.local {
		return "svcproxy, userspace mode with --steering=local: svcproxy puts the VIPs on its own dummy interface (svcproxy-vips) and listens on each frontend, as the peer proxies listen on theirs: no steering rules, --conn-log off"
	}
	if m.offload != "" {
		return "svcproxy, userspace mode as svcproxy-userspace, with --offload=" + m.offload + ": established connections' bytes moved by a BPF sockmap"
	}
	if m.kernelMode == "" && m.steeringBackend == "iptables" {
		return "svcproxy, userspace mode: REDIRECT steering written with iptables + ipset (--steering-backend=iptables) into the splice forwarder, 2 workers (GOMAXPROCS), --conn-log off"
	}
	if m.kernelMode == "" {
		return "svcproxy, userspace mode: REDIRECT steering written as its own nftables table over netlink (--steering-backend=nftables) into the splice forwarder, 2 workers (GOMAXPROCS), --conn-log off"
	}
	return "svcproxy --proxy-mode=" + m.kernelMode + ": the kernel data path programmed by svcproxy from the same snapshot"
}

// svcproxyHelp is `svcproxy --help`, read once.
var svcproxyHelp = struct {
	sync.Once
	text string
}{}

// hasFlag tells whether this svcproxy binary has the flag (name without
// dashes), so the bench works with older and newer binaries.
func hasFlag(e *Env, name string) bool {
	svcproxyHelp.Do(func() {
		out, _ := exec.Command(e.Svcproxy, "--help").CombinedOutput()
		svcproxyHelp.text = string(out)
	})
	return regexp.MustCompile(`(?m)^\s+--?` + regexp.QuoteMeta(name) + `\b`).MatchString(svcproxyHelp.text) // "-name" (Go's usage), "--name" (grouped help)
}

// knowsMode tells whether this svcproxy binary's help names the kernel
// mode (the --proxy-mode flag's help lists them, wrapped over lines), so a
// binary older than the mode is a skip, not a failure.
func knowsMode(e *Env, mode string) bool {
	return hasFlag(e, "proxy-mode") && strings.Contains(svcproxyHelp.text, mode)
}

func (m svcproxyMode) Available(e *Env) error {
	if m.offload != "" && !hasFlag(e, "offload") {
		return skipf("not built yet: this svcproxy has no --offload flag")
	}
	if m.local && (!hasFlag(e, "steering") || !strings.Contains(svcproxyHelp.text, "local (")) {
		return skipf("not built yet: this svcproxy has no --steering=local")
	}
	if m.kernelMode == "" && m.steeringBackend != "" && !m.onVIP && !m.local && !hasFlag(e, "steering-backend") {
		return skipf("not built yet: this svcproxy has no --steering-backend flag (its REDIRECT steering is iptables + ipset only: svcproxy-userspace runs that)")
	}
	if m.kernelMode == "" {
		return nil // preflight checked iptables and ipset
	}
	if !hasFlag(e, "proxy-mode") {
		return skipf("not built yet: this svcproxy has no --proxy-mode flag (kernelmodes/ is being built)")
	}
	if !knowsMode(e, m.kernelMode) {
		return skipf("not built yet: this svcproxy's --proxy-mode has no %s mode", m.kernelMode)
	}
	if m.kernelMode == "ipvs" {
		if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
			return skipf("this kernel has no IPVS (/proc/net/ip_vs is missing and modules cannot be loaded); --ipvs-vm runs it inside a QEMU VM, reported apart (emulated CPU, not comparable with the host rows)")
		}
	}
	return nil // Start finds out whether the mode is built in
}

// args are svcproxy's flags for a run on the services file.
func (m svcproxyMode) args(e *Env, services string) []string {
	return m.argsFor(func(name string) bool { return hasFlag(e, name) }, services)
}

// argsFor is args for a binary that has the flags has says it has.
func (m svcproxyMode) argsFor(has func(flag string) bool, services string) []string {
	args := []string{"--services", services, "--conn-log=", "--hostname-override", "node",
		"--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "127.0.0.1:10256", "--drain-timeout", "1s",
		"--log-format=json"}
	switch {
	case m.onVIP:
		args = append(args, "--steering=none")
	case m.local:
		args = append(args, "--steering=local")
	case m.kernelMode == "":
		args = append(args, "--steering=redirect")
		if has("steering-backend") {
			args = append(args, "--steering-backend="+m.steering())
		}
	default:
		args = append(args, "--proxy-mode="+m.kernelMode)
	}
	if has("handover-socket") {
		args = append(args, "--handover-socket=") // no restarts in the bench
	}
	if m.offload != "" {
		args = append(args, "--offload="+m.offload)
	}
	return args
}

// logEvent is a line of svcproxy's JSON log the bench acts on.
type logEvent struct {
	TS       float64 `json:"ts"` // seconds since the epoch
	Msg      string  `json:"msg"`
	Services int     `json:"services"`
	Version  uint64  `json:"version"`
	Mode     string  `json:"mode"`     // "svcproxy running": the proxy mode chosen
	Choice   string  `json:"choice"`   // "proxy mode fell back"
	Backend  string  `json:"backend"`  // "iptables backend detected": nf_tables or legacy; "steering with …": nftables or iptables
	IPTables string  `json:"iptables"` // "steering with …" on the iptables backend: nf_tables or legacy
	Error    string  `json:"error"`
	raw      string
}

func (ev logEvent) time() time.Time {
	sec := int64(ev.TS)
	return time.Unix(sec, int64((ev.TS-float64(sec))*1e9))
}

// svcproxyProc is a running svcproxy and the events of its log, in the
// order it wrote them.
type svcproxyProc struct {
	*Proc
	mu     sync.Mutex
	evs    []logEvent
	last   []string      // the last lines of output, for errors
	notify chan struct{} // a new event arrived
}

func (m svcproxyMode) launch(e *Env, c *Cluster, args []string) (*svcproxyProc, error) {
	sp := &svcproxyProc{notify: make(chan struct{}, 1)}
	p, err := c.StartLines(c.Topo.Node, m.name, func(line []byte) {
		var ev logEvent
		if json.Unmarshal(line, &ev) != nil {
			ev = logEvent{Msg: strings.TrimSpace(string(line))} // plain stderr: "svcproxy: …"
		}
		keep := false
		switch {
		case ev.Msg == "loaded services", ev.Msg == "applied", ev.Msg == "synced", ev.Msg == "svcproxy running",
			ev.Msg == "proxy mode fell back", ev.Msg == "iptables backend detected",
			strings.HasPrefix(ev.Msg, steeringPrefix), strings.HasPrefix(ev.Msg, "svcproxy: "):
			keep = true
		}
		sp.mu.Lock()
		sp.last = append(sp.last, string(line))
		if len(sp.last) > 12 {
			sp.last = sp.last[1:]
		}
		if keep {
			sp.evs = append(sp.evs, ev)
		}
		sp.mu.Unlock()
		if keep {
			select {
			case sp.notify <- struct{}{}:
			default:
			}
		}
	}, e.Svcproxy, args...)
	if err != nil {
		return nil, err
	}
	sp.Proc = p
	return sp, nil
}

func (sp *svcproxyProc) output() string {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	lines := make([]string, len(sp.last))
	for i, l := range sp.last {
		lines[i] = clip(l, 400) // one log line can join a thousand errors
	}
	return strings.Join(lines, "\n")
}

// clip shortens s to about n bytes, saying how much it left out.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return fmt.Sprintf("%s… (%d more bytes)", strings.ToValidUTF8(s[:n], ""), len(s)-n)
}

// fail wraps err with svcproxy's last output.
func (sp *svcproxyProc) fail(err error) error {
	return fmt.Errorf("%w; svcproxy's last output:\n%s", err, sp.output())
}

// mark is the position of the next event, for wait.
func (sp *svcproxyProc) mark() int {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return len(sp.evs)
}

// find returns the first event from index from on that matches.
func (sp *svcproxyProc) find(from int, match func(logEvent) bool) (logEvent, bool) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for _, ev := range sp.evs[min(from, len(sp.evs)):] {
		if match(ev) {
			return ev, true
		}
	}
	return logEvent{}, false
}

// wait returns the first event from index from on that matches, waiting
// for it; it fails when svcproxy exits or timeout passes. (Events are
// searched, not consumed: svcproxy's sync may log "applied" before the
// source logs "loaded services".) A "not built into this svcproxy" exit
// is a skip.
func (sp *svcproxyProc) wait(ctx context.Context, what string, from int, timeout time.Duration, match func(logEvent) bool) (logEvent, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		if ev, ok := sp.find(from, match); ok {
			return ev, nil
		}
		select {
		case <-sp.notify:
		case <-sp.done:
			if ev, ok := sp.find(from, match); ok {
				return ev, nil
			}
			if ev, ok := sp.find(0, func(ev logEvent) bool { return strings.Contains(ev.Msg, "not built into this svcproxy") }); ok {
				return logEvent{}, skipf("not built yet: %s", ev.Msg)
			}
			return logEvent{}, sp.fail(fmt.Errorf("svcproxy exited waiting for %s", what))
		case <-timer.C:
			return logEvent{}, sp.fail(fmt.Errorf("no %s within %v", what, timeout))
		case <-ctx.Done():
			return logEvent{}, ctx.Err()
		}
	}
}

// waitRunning waits for "svcproxy running" and checks the mode it chose is
// the one asked for (svcproxy falls back ipvs → iptables → userspace and
// nftables → iptables → userspace when the kernel cannot run a mode: that
// is a skip, reported with its reason). The iptables mode logs its iptables
// backend; the nftables mode has none (its tables are written over netlink).
func (m svcproxyMode) waitRunning(ctx context.Context, sp *svcproxyProc) (backend string, err error) {
	ev, err := sp.wait(ctx, "start-up", 0, 30*time.Second, func(ev logEvent) bool { return ev.Msg == "svcproxy running" })
	if err != nil {
		return "", err
	}
	if ev, ok := sp.find(0, func(ev logEvent) bool { return ev.Msg == "iptables backend detected" }); ok {
		backend = ev.Backend
	}
	var fellBack string
	if ev, ok := sp.find(0, func(ev logEvent) bool { return ev.Msg == "proxy mode fell back" }); ok {
		fellBack = ev.Choice
	}
	want := m.kernelMode
	if want == "" {
		want = "userspace"
	}
	if fellBack != "" || (ev.Mode != "" && !strings.HasPrefix(ev.Mode, want)) {
		sp.Stop()
		return "", skipf("svcproxy cannot run the %s mode here and fell back: %s", want, firstNonEmpty(fellBack, ev.Mode))
	}
	if _, err := m.steeredBy(sp); err != nil {
		sp.Stop()
		return "", err
	}
	return backend, nil
}

// steeredBy is what the userspace mode's steering is written with, from
// svcproxy's "steering with …" line: its backend field ("nftables",
// "iptables"), or "iptables" for a binary before --steering-backend
// (whose line has none); "" for a kernel mode or no steering. A backend
// other than the one asked for is an error.
func (m svcproxyMode) steeredBy(sp *svcproxyProc) (string, error) {
	if m.kernelMode != "" || m.onVIP || m.local {
		return "", nil
	}
	ev, ok := sp.find(0, func(ev logEvent) bool { return strings.HasPrefix(ev.Msg, steeringPrefix) })
	switch {
	case !ok:
		return "", sp.fail(fmt.Errorf("svcproxy runs but never said what steers (no %q line)", steeringPrefix+"…"))
	case ev.Backend == "":
		return "iptables", nil // before --steering-backend
	case ev.Backend != m.steering():
		return "", sp.fail(fmt.Errorf("svcproxy steers with %s, want %s", ev.Backend, m.steering()))
	}
	return ev.Backend, nil
}

func firstNonEmpty(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

// servicesFile writes the services file in a directory of its own: svcproxy
// watches the file's directory, and nothing else may write there.
func servicesFile(c *Cluster, services []SvcPort) (string, error) {
	dir := filepath.Join(c.Dir, "services")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "services.yaml")
	return path, writeAtomic(path, servicesYAML(services))
}

func (m svcproxyMode) Start(ctx context.Context, c *Cluster) (*Running, error) {
	if m.onVIP {
		if err := addVIPs(c); err != nil {
			return nil, err
		}
	}
	file, err := servicesFile(c, c.Services)
	if err != nil {
		return nil, err
	}
	sp, err := m.launch(c.Env, c, m.args(c.Env, file))
	if err != nil {
		return nil, err
	}
	backend, err := m.waitRunning(ctx, sp)
	if err != nil {
		return nil, err
	}
	run := &Running{
		Targets:  vipTargets(c.Services),
		Balances: true,
		Stop:     sp.Stop,
		Config:   "# svcproxy " + strings.Join(m.args(c.Env, "services.yaml"), " ") + "\n" + string(servicesYAML(c.Services)),
	}
	if m.kernelMode == "" {
		run.PIDs = func() []int { return []int{sp.Pid()} }
		run.Goroutines = func() (int, error) { return goroutines(c) }
	} // a kernel mode's process only programs: the data path is the kernel's
	if backend != "" {
		run.Notes = append(run.Notes, "Its iptables rules use the "+backend+" backend (the node's default iptables)")
	}
	if m.kernelMode == "nftables" {
		run.Notes = append(run.Notes, "Its rules are its own nftables table (ip svcproxy) of fixed rules over sets and maps, written over netlink: no iptables backend")
	}
	if by, _ := m.steeredBy(sp); by == "nftables" {
		run.Notes = append(run.Notes, "Its steering is its own nftables table (ip "+steeringTable+"): fixed rules redirecting through a frontend→port map, written over netlink; no iptables or ipset")
	}
	return run, nil
}

// servicesYAML writes svcproxy's services file for services; consecutive
// ports of one Service become one entry (they must share endpoint IPs).
func servicesYAML(services []SvcPort) []byte {
	var b bytes.Buffer
	b.WriteString("services:\n")
	for i := 0; i < len(services); {
		s := services[i]
		j := i + 1
		for j < len(services) && services[j].Namespace == s.Namespace && services[j].Service == s.Service {
			j++
		}
		fmt.Fprintf(&b, "  - name: %s\n    namespace: %s\n    clusterIPs: [%s]\n    ports:\n", s.Service, s.Namespace, s.VIP)
		for _, p := range services[i:j] {
			fmt.Fprintf(&b, "      - name: %s\n        port: %d\n        targetPort: %d\n", p.PortName, p.Port, p.Endpoints[0].Port())
			if p.Protocol == "UDP" {
				b.WriteString("        protocol: UDP\n")
			}
		}
		b.WriteString("    endpoints:\n")
		for _, ep := range s.Endpoints {
			fmt.Fprintf(&b, "      - ip: %s\n", ep.Addr())
		}
		i = j
	}
	return b.Bytes()
}

// ProgramServices times svcproxy programming services from scratch and then
// each endpoint change. The times come from its own log (JSON, debug
// level): "loaded services" (the file was read and the store published
// snapshot V) and "applied" or "synced" for a version ≥ V (the rules and
// sets are live; the userspace forwarder swapped its snapshot just before;
// for the nftables mode, its table's sets and maps). Changes are
// made by rewriting the services file and sending SIGHUP, so the file
// watcher's 100 ms debounce is not counted; the whole file is re-read and
// re-parsed on each change, which the end-to-end figure includes.
//
// The kernel modes log the same version-tagged line after each sync (the
// iptables and nftables modes "synced", the IPVS mode "applied"), at debug
// level for incremental syncs, hence --log-level=debug.
func (m svcproxyMode) ProgramServices(ctx context.Context, e *Env, c *Cluster, services []SvcPort, changes []EndpointChange) (*CPResult, error) {
	file, err := servicesFile(c, services)
	if err != nil {
		return nil, err
	}
	args := append(m.args(e, file), "--log-level=debug", "--sync-period=1h", "--metrics-bind-address=", "--healthz-bind-address=")
	t0 := time.Now()
	sp, err := m.launch(e, c, args)
	if err != nil {
		return nil, err
	}
	defer sp.Stop()
	n := len(services)
	timeout := 2*time.Minute + time.Duration(n)*10*time.Millisecond
	loaded, err := sp.wait(ctx, "load of the services file", 0, timeout, func(ev logEvent) bool { return ev.Msg == "loaded services" })
	if err != nil {
		return nil, err
	}
	if loaded.Services != n {
		return nil, sp.fail(fmt.Errorf("svcproxy loaded %d service ports, want %d", loaded.Services, n))
	}
	applied, err := sp.wait(ctx, "rules applied", 0, timeout, func(ev logEvent) bool { return live(ev) && ev.Version >= loaded.Version })
	if err != nil {
		return nil, err
	}
	res := &CPResult{
		Services: n, Endpoints: countEndpoints(services),
		Program:      applied.time().Sub(loaded.time()),
		ProgramTotal: applied.time().Sub(t0),
	}
	switch by, err := m.steeredBy(sp); {
	case err != nil:
		return nil, err
	case by == "iptables":
		if got, err := ipsetEntries(ctx, c, "svcproxy-svc-v4"); err != nil || got != n {
			return nil, sp.fail(fmt.Errorf("after the first sync the ipset svcproxy-svc-v4 has %d members (%v), want %d%s", got, err, n,
				readAgain(func() (int, error) { return ipsetEntries(ctx, c, "svcproxy-svc-v4") })))
		}
	case by == "nftables":
		if got, err := steeringFrontends(ctx, c); err != nil || got != n {
			return nil, sp.fail(fmt.Errorf("after the first sync the map %s of table ip %s has %d elements (%v), want %d%s", steertable.SetFrontends, steeringTable, got, err, n,
				readAgain(func() (int, error) { return steeringFrontends(ctx, c) })))
		}
	}
	res.Notes = append(res.Notes, "the services file is re-read and re-parsed whole on every change (SIGHUP); 'own' is store→rules live")

	version := loaded.Version
	for i, ch := range changes {
		e.Prog.detail(fmt.Sprintf("change %d/%d", i+1, len(changes)))
		services = ch.apply(services)
		if err := writeAtomic(file, servicesYAML(services)); err != nil {
			return nil, err
		}
		from := sp.mark()
		start := time.Now()
		if err := sp.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
			return nil, err
		}
		loaded, err := sp.wait(ctx, "reload", from, time.Minute, func(ev logEvent) bool { return ev.Msg == "loaded services" && ev.Version > version })
		if err != nil {
			return nil, err
		}
		version = loaded.Version
		applied, err := sp.wait(ctx, "change applied", from, time.Minute, func(ev logEvent) bool { return live(ev) && ev.Version >= loaded.Version })
		if err != nil {
			return nil, err
		}
		res.took(ch, applied.time().Sub(loaded.time()), applied.time().Sub(start))
	}
	return res, nil
}

// readAgain counts again, after a pause, what a check found short, and
// says what it found: the same count points at the rules, the full count
// at the first read (a dump that raced something) or at rules completed
// after the log line. The check fails either way.
func readAgain(count func() (int, error)) string {
	time.Sleep(500 * time.Millisecond)
	n, err := count()
	if err != nil {
		return fmt.Sprintf("; read again 0.5 s later: %v", err)
	}
	return fmt.Sprintf("; read again 0.5 s later: %d", n)
}

// live tells whether ev says a snapshot is programmed: the redirector's
// (either steering backend's) and the IPVS mode's "applied", the iptables
// and nftables modes' "synced", without an error (a failed write logs the
// same line with its error, and is retried).
func live(ev logEvent) bool { return (ev.Msg == "applied" || ev.Msg == "synced") && ev.Error == "" }

// steeringTable is the nftables steering backend's table.
const steeringTable = steertable.Table

// steeringFrontends counts the elements of the nftables steering
// backend's IPv4 frontends map in the node's namespace, read over netlink
// as svcproxy writes it (no nft binary needed).
func steeringFrontends(ctx context.Context, c *Cluster) (int, error) {
	es, err := steertable.Netlink(c.Topo.Node.NS).Elements(ctx, netfilter.IPv4, steertable.SetFrontends)
	return len(es), err
}

// ipsetEntries counts the members of an ipset in the node's namespace.
func ipsetEntries(ctx context.Context, c *Cluster, set string) (int, error) {
	out, err := c.Topo.Node.Command(ctx, "ipset", "list", "-t", set).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("ipset list -t %s: %v: %s", set, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "Number of entries:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("ipset list -t %s: no entry count in %q", set, out)
}

// writeAtomic replaces path's content in one rename, so a reader never sees
// half a file.
func writeAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func replaceEndpoint(s *SvcPort, ch EndpointChange) {
	for i, ep := range s.Endpoints {
		if ep == ch.Old {
			s.Endpoints[i] = ch.New
			return
		}
	}
	panic(fmt.Sprintf("bench: %s has no endpoint %s", s.Key(), ch.Old))
}

func countEndpoints(services []SvcPort) int {
	n := 0
	for _, s := range services {
		n += len(s.Endpoints)
	}
	return n
}

// goroutines reads go_goroutines from the svcproxy on c's node (its
// metrics listen on the node's loopback, see args).
func goroutines(c *Cluster) (int, error) {
	var n int
	err := c.Topo.Node.Do(func() error {
		// net/http would dial from a goroutine of its own, outside the
		// node's namespace: dial here and speak HTTP/1.0 by hand.
		conn, err := net.DialTimeout("tcp", "127.0.0.1:10249", 5*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, "GET /metrics HTTP/1.0\r\n\r\n"); err != nil {
			return err
		}
		sc := bufio.NewScanner(conn)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
				f, err := strconv.ParseFloat(v, 64)
				n = int(f)
				return err
			}
		}
		if err := sc.Err(); err != nil {
			return err
		}
		return fmt.Errorf("no go_goroutines in svcproxy's metrics")
	})
	return n, err
}
