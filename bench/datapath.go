package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/svcproxy/svcproxy/internal/topology"
)

// modeRound is one mode's data-path tests in one round, on a fresh cluster.
type modeRound struct {
	e     *Env
	res   *Results
	mode  Mode
	round int
	c     *Cluster
	run   *Running
}

func (r *modeRound) sample(test, metric string, v float64, unit, tool string) {
	r.res.add(Sample{Round: r.round, Mode: r.mode.Name(), Test: test, Metric: metric, Value: v, Unit: unit, Tool: tool})
}

// pids is the proxy's processes, nil for a kernel data path.
func (r *modeRound) pids() []int {
	if r.run.PIDs == nil {
		return nil
	}
	return r.run.PIDs()
}

// cpuMeter measures the proxy's CPU seconds over a test.
type cpuMeter struct {
	pids  []int
	start float64
}

func (r *modeRound) startCPU() *cpuMeter {
	p := r.pids()
	if p == nil {
		return nil
	}
	s, err := cpuSeconds(p)
	if err != nil {
		return nil
	}
	return &cpuMeter{pids: p, start: s}
}

// used is the CPU seconds since startCPU; ok false for a kernel data path.
func (m *cpuMeter) used() (float64, bool) {
	if m == nil {
		return 0, false
	}
	s, err := cpuSeconds(m.pids)
	if err != nil {
		return 0, false
	}
	return s - m.start, true
}

// runRound sets the mode up on a fresh cluster, checks it serves, runs each
// test, and tears everything down. Errors name the test; a test's failure
// does not stop the others. A mode that finds at start-up that it cannot
// run here returns only an errSkip error.
func runRound(ctx context.Context, e *Env, res *Results, m Mode, round int, steps func(string)) (errs []error) {
	r := &modeRound{e: e, res: res, mode: m, round: round}
	res.mu.Lock()
	res.Loads = append(res.Loads, LoadSample{Round: round, Mode: m.Name(), Load1: loadAvg()[0]})
	res.mu.Unlock()
	steps("setting up")
	c, err := newCluster(e, fmt.Sprintf("r%d-%s", round, m.Name()), 1, 3)
	if err != nil {
		return []error{fmt.Errorf("building namespaces: %w", err)}
	}
	r.c = c
	defer func() {
		if r.run != nil {
			r.run.Stop()
		}
		if err := c.Close(); err != nil {
			errs = append(errs, fmt.Errorf("cleaning up: %w", err))
		}
	}()
	if err := c.startBackends(ctx); err != nil {
		return []error{fmt.Errorf("starting backends: %w", err)}
	}
	run, err := m.Start(ctx, c)
	if errors.Is(err, errSkip) {
		return []error{err}
	}
	if err != nil {
		return []error{fmt.Errorf("starting: %w", err)}
	}
	r.run = run
	if err := checkServing(ctx, c, run); err != nil {
		return []error{fmt.Errorf("not serving: %w", err)}
	}
	if round == 1 {
		mr := res.mode(m.Name())
		mr.Notes = append(mr.Notes, run.Notes...)
		if run.Config != "" && res.Dir != "" {
			_ = os.WriteFile(filepath.Join(res.Dir, m.Name()+".conf"), []byte(run.Config), 0o644)
		}
	}
	d := e.Cfg.Duration
	tests := []struct {
		name string
		fn   func(context.Context) error
	}{
		{testBulk1, func(ctx context.Context) error { return r.bulk(ctx, testBulk1, 1, d) }},
		{testBulk4, func(ctx context.Context) error { return r.bulk(ctx, testBulk4, 4, d) }},
		{testKeepAlive, r.keepAlive},
		{testMiB, r.mib},
		{"syscalls", r.syscalls}, // before the churn of the connection tests
		{"perf", r.perf},
		{testConnRate, r.connRate},
		{testUDP, r.udp},
		{testIdle, r.idle},
		{testFault, r.fault},
	}
	for _, t := range tests {
		switch {
		case t.name == "syscalls":
			if round != 1 || !e.Cfg.Syscalls || e.Tools.Strace == "" || run.PIDs == nil {
				continue
			}
		case t.name == "perf":
			if round != 1 || !e.Cfg.Perf || e.Tools.Perf == "" || run.PIDs == nil || r.res.Dir == "" {
				continue
			}
		case !e.Cfg.runs(t.name):
			continue
		}
		if ctx.Err() != nil {
			return append(errs, ctx.Err())
		}
		steps(t.name)
		if err := t.fn(ctx); err != nil {
			if errors.Is(err, errSkip) {
				continue
			}
			errs = append(errs, fmt.Errorf("%s: %w", t.name, err))
		}
		settle(ctx, 300*time.Millisecond)
	}
	return errs
}

func settle(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// bulk: one or four streams of bulk data through the mode; proxy CPU per GB.
func (r *modeRound) bulk(ctx context.Context, test string, streams int, d time.Duration) error {
	cpu := r.startCPU()
	b, err := runBulk(ctx, r.e, r.c, r.run, streams, d)
	if err != nil {
		return err
	}
	r.sample(test, "gbps", b.gbps(), "Gbit/s", b.Tool)
	if b.Retransmits >= 0 {
		r.sample(test, "retransmits", float64(b.Retransmits), "segments", b.Tool)
	}
	if s, ok := cpu.used(); ok {
		r.sample(test, "cpu_s_per_gb", s/(float64(b.Bytes)/1e9), "CPU s/GB", b.Tool)
	}
	return nil
}

// keepAlive: 1 KiB responses over 64 keep-alive connections.
func (r *modeRound) keepAlive(ctx context.Context) error {
	cpu := r.startCPU()
	l, err := runHTTPLoad(ctx, r.e, r.c.Topo.Clients[0], r.run.Targets[svcHTTP], r.c.paths().small, 64, r.e.Cfg.Duration, false)
	if err != nil {
		return err
	}
	test := testKeepAlive
	r.sample(test, "rps", l.rate(), "req/s", l.Tool)
	r.sample(test, "p50_ms", ms(l.P50), "ms", l.Tool)
	r.sample(test, "p90_ms", ms(l.P90), "ms", l.Tool)
	r.sample(test, "p99_ms", ms(l.P99), "ms", l.Tool)
	r.sample(test, "p999_ms", ms(l.P999), "ms", l.Tool)
	r.sample(test, "errors", float64(l.errorCount()), "requests", l.Tool)
	if s, ok := cpu.used(); ok && l.Requests > 0 {
		r.sample(test, "cpu_us_per_req", s/float64(l.Requests)*1e6, "CPU µs/req", l.Tool)
	}
	return nil
}

// mib: 1 MiB responses over 8 keep-alive connections.
func (r *modeRound) mib(ctx context.Context) error {
	l, err := runHTTPLoad(ctx, r.e, r.c.Topo.Clients[0], r.run.Targets[svcHTTP], r.c.paths().mib, 8, r.e.Cfg.Duration, false)
	if err != nil {
		return err
	}
	r.sample(testMiB, "per_s", l.rate(), "transfers/s", l.Tool)
	r.sample(testMiB, "gbps", l.rate()*(1<<20)*8/1e9, "Gbit/s", l.Tool)
	r.sample(testMiB, "p99_ms", ms(l.P99), "ms", l.Tool)
	r.sample(testMiB, "errors", float64(l.errorCount()), "requests", l.Tool)
	return nil
}

// connRate: a new connection per request (Connection: close) over 64
// concurrent connections; SYN retransmits in the client's and the node's
// namespaces; proxy CPU per 10,000 connections.
func (r *modeRound) connRate(ctx context.Context) error {
	client, node := r.c.Topo.Clients[0], r.c.Topo.Node
	c0, err := readTCPCounters(client)
	if err != nil {
		return err
	}
	n0, err := readTCPCounters(node)
	if err != nil {
		return err
	}
	cpu := r.startCPU()
	l, err := runHTTPLoad(ctx, r.e, client, r.run.Targets[svcHTTP], r.c.paths().small, 64, r.e.Cfg.Duration, true)
	if err != nil {
		return err
	}
	s, cpuOK := cpu.used()
	c1, err := readTCPCounters(client)
	if err != nil {
		return err
	}
	n1, err := readTCPCounters(node)
	if err != nil {
		return err
	}
	test := testConnRate
	r.sample(test, "conn_per_s", l.rate(), "conn/s", l.Tool)
	r.sample(test, "errors", float64(l.errorCount()), "requests", l.Tool)
	r.sample(test, "syn_retrans_client", float64(c1.sub(c0).SynRetrans), "SYNs", l.Tool)
	r.sample(test, "syn_retrans_node", float64(n1.sub(n0).SynRetrans), "SYNs", l.Tool)
	r.sample(test, "retrans_segs_client", float64(c1.sub(c0).RetransSegs), "segments", l.Tool)
	if cpuOK && l.Requests > 0 {
		r.sample(test, "cpu_s_per_10k", s/float64(l.Requests)*1e4, "CPU s/10k conns", l.Tool)
	}
	return nil
}

// udp: DNS queries (dnsperf, 16 clients, one second to answer) to the dns
// Service's dnsmasq on every backend: first as fast as answers come (the
// peak queries/s, and the loss and p99 there), then at 80 % of this mode's
// own peak, where a proxy should lose nothing: the loss and p99 at a load
// it claims to carry. Proxy CPU per query at the peak.
func (r *modeRound) udp(ctx context.Context) error {
	target, ok := r.run.Targets[svcDNS]
	switch {
	case r.e.Tools.Dnsperf == "" || r.e.Tools.Dnsmasq == "":
		return skipf("dnsperf or dnsmasq is not installed (apt-get install dnsperf dnsmasq-base)")
	case !ok:
		return skipf("%s proxies no UDP", r.mode.Name())
	}
	client := r.c.Topo.Clients[0]
	cpu := r.startCPU()
	peak, err := runDNSPerf(ctx, r.e, client, target, r.e.Cfg.Duration, 0)
	if err != nil {
		return err
	}
	r.sample(testUDP, "qps", peak.QPS, "queries/s", "dnsperf")
	r.sample(testUDP, "loss_pct", peak.lossPct(), "%", "dnsperf")
	r.sample(testUDP, "p99_ms", ms(peak.P99), "ms", "dnsperf")
	if s, ok := cpu.used(); ok && peak.Sent > 0 {
		r.sample(testUDP, "cpu_us_per_query", s/float64(peak.Sent)*1e6, "CPU µs/query", "dnsperf")
	}
	settle(ctx, 300*time.Millisecond)
	at, err := runDNSPerf(ctx, r.e, client, target, r.e.Cfg.Duration, max(1, int(0.8*peak.QPS)))
	if err != nil {
		return err
	}
	r.sample(testUDP, "qps_at_80", at.QPS, "queries/s", "dnsperf")
	r.sample(testUDP, "loss_pct_at_80", at.lossPct(), "%", "dnsperf")
	r.sample(testUDP, "p99_ms_at_80", ms(at.P99), "ms", "dnsperf")
	return nil
}

// idle: the proxy's memory with IdleConns idle connections open through it.
func (r *modeRound) idle(ctx context.Context) error {
	pids := r.pids()
	if pids == nil {
		return skipf("no proxy process")
	}
	base, err := memoryOf(pids)
	if err != nil {
		return err
	}
	fds0 := fdCount(pids)
	n := r.e.Cfg.IdleConns
	target := r.run.Targets[svcHTTP].String()
	client := r.c.Topo.Clients[0]
	conns := make([]net.Conn, n)
	var next atomic.Int64
	var failed atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = client.Do(func() error {
				d := net.Dialer{Timeout: 5 * time.Second}
				for {
					i := int(next.Add(1)) - 1
					if i >= n || ctx.Err() != nil {
						return nil
					}
					c, err := d.DialContext(ctx, "tcp", target)
					if err != nil {
						failed.Add(1)
						once.Do(func() { firstErr = err })
						continue
					}
					conns[i] = c
				}
			})
		}()
	}
	wg.Wait()
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	if f := failed.Load(); f > int64(n)/100 {
		return fmt.Errorf("%d of %d idle connections failed to open: %v", f, n, firstErr)
	}
	opened := n - int(failed.Load())
	// Wait until the proxy holds them (accepted and dialed upstream: two
	// descriptors each), or its descriptor count stops growing for 3 s.
	want := fds0 + 2*opened
	deadline := time.Now().Add(30 * time.Second)
	fds, grew := fdCount(pids), time.Now()
	for fds < want && time.Since(grew) < 3*time.Second && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
		if f := fdCount(pids); f > fds {
			fds, grew = f, time.Now()
		}
	}
	settle(ctx, time.Second)
	mem, err := memoryOf(pids)
	if err != nil {
		return err
	}
	fds = fdCount(pids)
	held := (fds - fds0) / 2
	const tool = "built-in Go dialer"
	r.sample(testIdle, "conns", float64(opened), "connections", tool)
	r.sample(testIdle, "held", float64(held), "connections", tool)
	r.sample(testIdle, "rss_mib", float64(mem.rssKiB)/1024, "MiB", tool)
	r.sample(testIdle, "pss_mib", float64(mem.pssKiB)/1024, "MiB", tool)
	r.sample(testIdle, "rss_base_mib", float64(base.rssKiB)/1024, "MiB", tool)
	if r.run.Goroutines != nil {
		if g, err := r.run.Goroutines(); err == nil {
			r.sample(testIdle, "goroutines", float64(g), "goroutines", "the proxy's go_goroutines metric")
		} else {
			fmt.Fprintf(os.Stderr, "bench: %s: reading the goroutine count: %v\n", r.mode.Name(), err)
		}
	}
	if held > 0 {
		// Per connection the proxy holds; where fewer than asked could be
		// opened (open-files limit), scaled to the number asked for.
		perConn := float64(mem.rssKiB-min(mem.rssKiB, base.rssKiB)) / float64(held)
		r.sample(testIdle, "rss_kib_per_conn", perConn, "KiB", tool)
		r.sample(testIdle, "rss_mib_wanted", (float64(base.rssKiB)+perConn*float64(r.e.IdleWanted))/1024, "MiB", tool)
	}
	// A proxy may drop some of a burst of new connections (svcproxy fails
	// a connection whose backend dial times out): a finding, reported with
	// the figures; only most of them missing makes the figures meaningless.
	if held < opened/2 {
		return fmt.Errorf("the proxy holds %d of the %d idle connections the client opened (by its descriptors, two per connection)", held, opened)
	}
	return nil
}

// fault: new-connection requests from 8 workers to the three-endpoint
// Service; a third of the way in one backend's server is SIGKILLed (its
// port then refuses). No endpoint is removed: this is the window before a
// control plane notices. Counted: requests the client saw fail, split by
// when: within faultWindow of the kill (requests in flight on the dying
// backend, which no L4 proxy can save) or later (new connections sent to
// the dead backend: what retry on refusal prevents).
func (r *modeRound) fault(ctx context.Context) error {
	if !r.run.Balances {
		return skipf("the mode does not balance")
	}
	client := r.c.Topo.Clients[0]
	target := r.run.Targets[svcFault].String()
	d := r.e.Cfg.FaultDuration
	start := time.Now()
	deadline := start.Add(d)
	var killedAt atomic.Int64 // unix nanoseconds; 0: not yet
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		select {
		case <-time.After(d / 3):
			killedAt.Store(time.Now().UnixNano())
			r.c.fault[len(r.c.fault)-1].Kill()
		case <-ctx.Done():
		}
	}()
	var ok atomic.Int64
	var mu sync.Mutex
	fails := map[string]int64{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = client.Do(func() error {
				dialer := net.Dialer{Timeout: 3 * time.Second}
				for time.Now().Before(deadline) && ctx.Err() == nil {
					sent := time.Now()
					err := faultRequest(ctx, &dialer, target)
					if err == nil {
						ok.Add(1)
						continue
					}
					kind := errClass(err)
					connectFailed := strings.HasPrefix(err.Error(), "dial: ")
					if connectFailed {
						kind = "connect_" + kind
					}
					when := "before_kill"
					if k := killedAt.Load(); k != 0 {
						// A request that got a connection, was sent before
						// the kill or just after it, and failed, may have
						// been on the dying backend: in flight. One whose
						// connection failed never reached a backend.
						if !connectFailed && sent.UnixNano() < k+int64(faultWindow) {
							when = "at_kill"
						} else {
							when = "after_kill"
						}
					}
					mu.Lock()
					fails[when]++
					fails["kind_"+kind]++
					mu.Unlock()
				}
				return nil
			})
		}()
	}
	wg.Wait()
	<-killed
	if ctx.Err() != nil {
		return ctx.Err()
	}
	const tool = "built-in Go client"
	failed := fails["before_kill"] + fails["at_kill"] + fails["after_kill"]
	for k, n := range fails {
		r.sample(testFault, "failed_"+k, float64(n), "requests", tool)
	}
	for _, k := range []string{"at_kill", "after_kill"} {
		if fails[k] == 0 {
			r.sample(testFault, "failed_"+k, 0, "requests", tool)
		}
	}
	r.sample(testFault, "failed", float64(failed), "requests", tool)
	r.sample(testFault, "requests", float64(failed+ok.Load()), "requests", tool)
	return nil
}

// faultWindow: a request sent up to this long after the kill may still
// have been accepted by the dying backend (it was in flight).
const faultWindow = 50 * time.Millisecond

// faultRequest is one GET on a new connection.
func faultRequest(ctx context.Context, dialer *net.Dialer, target string) error {
	conn, err := dialer.DialContext(ctx, "tcp", target)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil && resp.StatusCode != 200 {
		err = fmt.Errorf("status %d", resp.StatusCode)
	}
	return err
}

// syscalls: strace -c over the proxy's processes for 2 s in the middle of a
// keep-alive load (64 connections already open) and of one bulk stream.
// Requests in the window are counted by backend0's nginx (stub_status),
// bytes by the node's link to backend0, so connection set-up is not
// counted. strace slows the proxy several-fold: only the counts per request
// and per byte mean anything, not the rates.
func (r *modeRound) syscalls(ctx context.Context) error {
	pids := r.pids()
	const window = 2 * time.Second
	client := r.c.Topo.Clients[0]
	// during runs load for 4 s and profiles the proxy from 1.5 s on.
	during := func(name string, load func() error, count func() (int64, error)) (*SyscallProfile, error) {
		done := make(chan error, 1)
		go func() { done <- load() }()
		settle(ctx, 1500*time.Millisecond)
		before, err := count()
		if err != nil {
			<-done
			return nil, err
		}
		p, err := straceFor(ctx, r.e, r.c.Dir, pids, window)
		after, cerr := count()
		if lerr := <-done; lerr != nil {
			err = fmt.Errorf("the load failed: %w", lerr) // the likelier cause of anything else
		}
		if err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		p.Mode, p.Load = r.mode.Name(), name
		if name == "keepalive" {
			p.Requests = after - before
		} else {
			p.Bytes = after - before
		}
		return p, nil
	}
	var profs []SyscallProfile
	if r.e.Tools.Nginx != "" { // stub_status counts the requests
		p, err := during("keepalive", func() error {
			_, err := runHTTPLoad(ctx, r.e, client, r.run.Targets[svcHTTP], r.c.paths().small, 64, 4*time.Second, false)
			return err
		}, func() (int64, error) { return backendRequests(ctx, r.c) })
		if err != nil {
			return err
		}
		profs = append(profs, *p)
	}
	p, err := during("bulk", func() error {
		_, err := runBulk(ctx, r.e, r.c, r.run, 1, 4*time.Second)
		return err
	}, func() (int64, error) { return linkTxBytes(r.c.Topo.Node, r.c.Topo.Backends[0].NodeLink) })
	if err != nil {
		return err
	}
	profs = append(profs, *p)
	r.res.mu.Lock()
	r.res.Syscalls = append(r.res.Syscalls, profs...)
	r.res.mu.Unlock()
	return nil
}

// perf records a CPU profile of the proxy (perf record -g, 3 s) in the
// middle of keep-alive, new-connection, 1 MiB and (where the mode proxies
// UDP) DNS load, and saves the report.
func (r *modeRound) perf(ctx context.Context) error {
	client := r.c.Topo.Clients[0]
	paths := r.c.paths()
	dns, dnsOK := r.run.Targets[svcDNS]
	dnsOK = dnsOK && r.e.Tools.Dnsperf != "" && r.e.Tools.Dnsmasq != ""
	for _, load := range []struct {
		name, path string
		conns      int
		closeEach  bool
		dns        bool // dnsperf as fast as answers come (the udp test's peak), not HTTP
	}{{"keepalive", paths.small, 64, false, false}, {"connrate", paths.small, 64, true, false}, {"mib", paths.mib, 8, false, false}, {"udp", "", 0, false, true}} {
		if load.dns && !dnsOK {
			continue
		}
		done := make(chan error, 1)
		go func() {
			var err error
			if load.dns {
				_, err = runDNSPerf(ctx, r.e, client, dns, 6*time.Second, 0)
			} else {
				_, err = runHTTPLoad(ctx, r.e, client, r.run.Targets[svcHTTP], load.path, load.conns, 6*time.Second, load.closeEach)
			}
			done <- err
		}()
		settle(ctx, 1500*time.Millisecond)
		data := filepath.Join(r.c.Dir, "perf-"+load.name+".data")
		var pids []string
		for _, p := range r.pids() {
			pids = append(pids, strconv.Itoa(p))
		}
		// One -p with a comma-separated list: perf keeps only the last of
		// several -p options (nginx's profiles covered one worker).
		args := []string{"record", "-q", "-F", "999", "-g", "-o", data, "-p", strings.Join(pids, ",")}
		args = append(args, "--", "sleep", "3")
		out, err := exec.CommandContext(ctx, r.e.Tools.Perf, args...).CombinedOutput()
		if lerr := <-done; err == nil {
			err = lerr
		}
		if err != nil {
			return fmt.Errorf("perf record during %s: %v: %s", load.name, err, lastLines(out, 3))
		}
		var report strings.Builder
		fmt.Fprintf(&report, "# %s, %s load: perf record -g -F 999 for 3 s over the proxy's processes\n", r.mode.Name(), load.name)
		for _, rep := range [][]string{
			{"--sort", "dso", "--no-children"},
			{"--sort", "symbol", "--children", "--percent-limit", "3"},
		} {
			out, err := exec.CommandContext(ctx, r.e.Tools.Perf, append([]string{"report", "-i", data, "--stdio", "-g", "none"}, rep...)...).Output()
			if err != nil {
				return fmt.Errorf("perf report: %v", err)
			}
			report.Write(out)
		}
		name := fmt.Sprintf("perf-%s-%s.txt", r.mode.Name(), load.name)
		if err := os.WriteFile(filepath.Join(r.res.Dir, name), []byte(report.String()), 0o644); err != nil {
			return err
		}
		prof := PerfProfile{Mode: r.mode.Name(), Load: load.name, File: name}
		for _, line := range strings.Split(report.String(), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[1] == "[kernel.kallsyms]" {
				prof.KernelPct, _ = strconv.ParseFloat(strings.TrimSuffix(f[0], "%"), 64)
			}
		}
		r.res.mu.Lock()
		r.res.Profiles = append(r.res.Profiles, prof)
		r.res.mu.Unlock()
	}
	return nil
}

// backendRequests is the requests backend0's nginx has served
// (stub_status).
func backendRequests(ctx context.Context, c *Cluster) (int64, error) {
	code, body, err := httpGet(ctx, c.Topo.Node, netip.AddrPortFrom(c.Topo.Backends[0].Addr, portHTTP), "/status")
	if err != nil {
		return 0, err
	}
	// "Active connections: 65 \nserver accepts handled requests\n 70 70 123456 \n…"
	lines := strings.Split(string(body), "\n")
	if code != 200 || len(lines) < 3 {
		return 0, fmt.Errorf("stub_status: status %d: %q", code, body)
	}
	f := strings.Fields(lines[2])
	if len(f) < 3 {
		return 0, fmt.Errorf("stub_status: %q", body)
	}
	return strconv.ParseInt(f[2], 10, 64)
}

// linkTxBytes is the bytes h has sent on its link dev (/proc/net/dev).
func linkTxBytes(h *topology.Host, dev string) (int64, error) {
	var data []byte
	if err := h.Do(func() (err error) {
		data, err = os.ReadFile("/proc/thread-self/net/dev")
		return err
	}); err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(name) != dev {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 9 {
			break
		}
		return strconv.ParseInt(f[8], 10, 64) // receive: 8 fields, then transmit bytes
	}
	return 0, fmt.Errorf("no link %s in /proc/net/dev", dev)
}

// straceFor attaches strace -c -f to pids for d and returns the syscall
// counts. strace attaches in a few milliseconds and detaches on SIGINT.
func straceFor(ctx context.Context, e *Env, dir string, pids []int, d time.Duration) (*SyscallProfile, error) {
	out := filepath.Join(dir, fmt.Sprintf("strace-%d.txt", time.Now().UnixNano()))
	args := []string{"-c", "-f", "-o", out}
	for _, p := range pids {
		args = append(args, "-p", strconv.Itoa(p))
	}
	cmd := exec.Command(e.Tools.Strace, args...) // ptrace only: it sends no traffic
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	settle(ctx, d)
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
	data, err := os.ReadFile(out)
	if err != nil {
		return nil, fmt.Errorf("strace wrote no summary: %v: %s", err, stderr.String())
	}
	calls, total := parseStraceSummary(string(data))
	if total == 0 {
		return nil, fmt.Errorf("strace counted no syscalls: %s", stderr.String())
	}
	return &SyscallProfile{Calls: calls, Total: total}, nil
}

// parseStraceSummary reads strace -c's table ("% time, seconds, usecs/call,
// calls, [errors,] syscall") and returns the calls per syscall and their sum.
func parseStraceSummary(s string) (map[string]int64, int64) {
	calls := map[string]int64{}
	var total int64
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || strings.HasPrefix(line, "%") || strings.HasPrefix(line, "-") {
			continue
		}
		name := f[len(f)-1]
		if name == "total" {
			continue
		}
		if n, err := strconv.ParseInt(f[3], 10, 64); err == nil {
			calls[name] += n
			total += n
		}
	}
	return calls, total
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
