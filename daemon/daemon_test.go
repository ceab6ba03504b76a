package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/svcproxy/svcproxy/handover"
	"github.com/svcproxy/svcproxy/health"
	"github.com/svcproxy/svcproxy/healthcheck"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/proxymode"
)

// recorder is a fake proxy mode that records what the daemon asks of it.
type recorder struct {
	name  proxymode.Name
	mu    *sync.Mutex
	calls *[]string
	fails *atomic.Int32 // Apply fails while positive, counting down
}

func (r recorder) record(call string) {
	r.mu.Lock()
	*r.calls = append(*r.calls, string(r.name)+" "+call)
	r.mu.Unlock()
}

func (r recorder) Apply(_ context.Context, _ *lb.Snapshot, full bool) error {
	if full {
		r.record("apply full")
	}
	if r.fails.Add(-1) >= 0 {
		return errors.New("injected: the kernel refused the rules")
	}
	return nil
}
func (r recorder) Cleanup(context.Context) error { r.record("cleanup"); return nil }
func (r recorder) Close(_ context.Context, handedOver bool) error {
	if handedOver {
		r.record("close, handed over")
	} else {
		r.record("close")
	}
	return nil
}
func (r recorder) Available(context.Context) error { return nil }

// recorders is a table of every mode, each a recorder; the unusable ones'
// probes fail.
func recorders(mu *sync.Mutex, calls *[]string, fails *atomic.Int32, unusable ...proxymode.Name) proxymode.Table {
	table := proxymode.Table{}
	for _, name := range []proxymode.Name{proxymode.Userspace, proxymode.IPTables, proxymode.IPVS, proxymode.NFTables} {
		r := recorder{name: name, mu: mu, calls: calls, fails: fails}
		e := proxymode.Entry{
			New:     func(context.Context, map[string]*os.File) (proxymode.Mode, error) { return r, nil },
			Cleanup: r.Cleanup,
		}
		if slices.Contains(unusable, name) {
			e.Probe = func(context.Context) error { return errors.New("no " + string(name)) }
		}
		table[name] = e
	}
	return table
}

// TestRun runs the daemon over fake modes and sources: it chooses the mode
// (falling back), removes the other modes' rules before building it
// (unless it is userspace without steering), applies the first load in a
// full sync, and ends on ctx or a failing source, closing the mode.
func TestRun(t *testing.T) {
	errSource := errors.New("injected: the API server went away")
	for _, tc := range []struct {
		name       string
		mode       proxymode.Name
		steering   string
		unusable   []proxymode.Name // modes whose probe fails
		source     func(ctx context.Context, feed Feed) error
		successor  bool // a successor takes over after the first sync
		tampered   bool // after the first sync, WatchRules reports the rules changed by another process
		failFirst  bool // the first sync fails: logged, then retried in full
		wantErr    string
		wantChosen proxymode.Name
		want       []string // the modes' calls, in order
	}{
		{name: "ipvs falls back to iptables; ipvs and userspace rules removed; ctx ends it",
			mode: proxymode.IPVS, unusable: []proxymode.Name{proxymode.IPVS}, wantChosen: proxymode.IPTables,
			want: []string{"userspace cleanup", "ipvs cleanup", "nftables cleanup", "iptables apply full", "iptables close"}},
		{name: "nftables falls back to iptables; nftables, ipvs and userspace rules removed",
			mode: proxymode.NFTables, unusable: []proxymode.Name{proxymode.NFTables}, wantChosen: proxymode.IPTables,
			want: []string{"userspace cleanup", "ipvs cleanup", "nftables cleanup", "iptables apply full", "iptables close"}},
		{name: "nftables: the other modes' rules removed, in order",
			mode: proxymode.NFTables, wantChosen: proxymode.NFTables,
			want: []string{"userspace cleanup", "iptables cleanup", "ipvs cleanup", "nftables apply full", "nftables close"}},
		{name: "a successor takes over: the mode is closed handed over, its rules left",
			mode: proxymode.IPTables, successor: true, wantChosen: proxymode.IPTables,
			want: []string{"userspace cleanup", "ipvs cleanup", "nftables cleanup", "iptables apply full", "iptables close, handed over"}},
		{name: "userspace without steering removes nothing",
			mode: proxymode.Userspace, steering: "none", wantChosen: proxymode.Userspace,
			want: []string{"userspace apply full", "userspace close"}},
		{name: "userspace with steering removes the kernel modes' rules",
			mode: proxymode.Userspace, steering: "redirect", wantChosen: proxymode.Userspace,
			want: []string{"iptables cleanup", "ipvs cleanup", "nftables cleanup", "userspace apply full", "userspace close"}},
		{name: "userspace with local steering removes the kernel modes' rules",
			mode: proxymode.Userspace, steering: "local", wantChosen: proxymode.Userspace,
			want: []string{"iptables cleanup", "ipvs cleanup", "nftables cleanup", "userspace apply full", "userspace close"}},
		{name: "a failed sync is logged and retried in full",
			mode: proxymode.IPTables, failFirst: true, wantChosen: proxymode.IPTables,
			want: []string{"userspace cleanup", "ipvs cleanup", "nftables cleanup", "iptables apply full", "iptables apply full", "iptables close"}},
		{name: "rules changed by another process: a full sync at once",
			mode: proxymode.IPTables, tampered: true, wantChosen: proxymode.IPTables,
			want: []string{"userspace cleanup", "ipvs cleanup", "nftables cleanup", "iptables apply full", "iptables apply full", "iptables close"}},
		{name: "a source failing after its first load ends it with the error",
			mode: proxymode.IPTables, wantChosen: proxymode.IPTables,
			source: func(ctx context.Context, feed Feed) error {
				feed.Loaded(0, nil)
				time.Sleep(300 * time.Millisecond)
				return errSource
			},
			wantErr: "loading services: injected", want: []string{"userspace cleanup", "ipvs cleanup", "nftables cleanup", "iptables apply full", "iptables close"}},
		{name: "a source failing before any load: nothing synced, the mode is not closed",
			mode: proxymode.IPTables, wantChosen: proxymode.IPTables,
			source:  func(context.Context, Feed) error { return errSource },
			wantErr: "loading services: injected", want: []string{"userspace cleanup", "ipvs cleanup", "nftables cleanup"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var calls []string
			var fails atomic.Int32
			if tc.failFirst {
				fails.Store(1)
			}
			table := recorders(&mu, &calls, &fails, tc.unusable...)
			source := tc.source
			if source == nil {
				source = func(ctx context.Context, feed Feed) error { feed.Loaded(0, nil); <-ctx.Done(); return nil }
			}
			logs, observed := observer.New(zap.ErrorLevel)
			log := zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), logs))
			reg := prometheus.NewPedanticRegistry()
			path := ""
			if tc.successor {
				path = filepath.Join(t.TempDir(), "handover.sock")
			}
			term, ctx, cancel := terminated(t, 0, log)
			cfg := Config{
				Logger: log, Registry: reg, Store: lb.NewStore(lb.StoreOptions{}), Source: source,
				Tracker: health.NewTracker(time.Minute, nil), Modes: table, Mode: tc.mode, Steering: tc.steering,
				IPv6:        func(context.Context, proxymode.Name) error { return nil },
				Succession:  handover.NewSuccession(path, handover.OS{NotifyRestart: func(chan<- os.Signal) error { return errors.ErrUnsupported }}, log),
				Termination: term, DrainTimeout: time.Second, SyncPeriod: time.Hour,
			}
			watched := make(chan func(), 1)
			cfg.WatchRules = func(_ context.Context, mode proxymode.Name, changed func()) error {
				if mode != tc.wantChosen {
					t.Errorf("WatchRules for %s, want %s", mode, tc.wantChosen)
				}
				watched <- changed
				return nil
			}
			done := make(chan error, 1)
			go func() { done <- Run(ctx, cfg) }()
			if tc.wantErr == "" {
				waitForCall(t, &mu, &calls, string(tc.wantChosen)+" apply full")
				deadline := time.Now().Add(10 * time.Second)
				if tc.tampered {
					(<-watched)()
				}
				if tc.tampered || tc.failFirst {
					for full := 0; full < 2; {
						mu.Lock()
						full = 0
						for _, c := range calls {
							if strings.HasSuffix(c, "apply full") {
								full++
							}
						}
						mu.Unlock()
						if time.Now().After(deadline) {
							t.Fatal("no second full sync within 10s")
						}
						time.Sleep(10 * time.Millisecond)
					}
				}
				if tc.failFirst {
					if got := observed.FilterMessage("sync failed; retrying").All(); len(got) != 1 || !strings.Contains(got[0].ContextMap()["error"].(string), "injected") {
						t.Errorf("logged %v, want one \"sync failed; retrying\" with the error", observed.All())
					}
				}
				if tc.tampered {
					if got := counterValue(t, reg, "svcproxy_rules_changed_by_others_total"); got != 1 {
						t.Errorf("svcproxy_rules_changed_by_others_total = %v, want 1", got)
					}
				}
				if tc.successor {
					takeOver(t, path)
				} else {
					cancel()
				}
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return within 10s")
			}
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Run = %v, want error %q", err, tc.wantErr)
			}
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(calls, tc.want) {
				t.Errorf("calls %q, want %q", calls, tc.want)
			}
			if got := labelValues(t, reg, "svcproxy_proxy_mode", "mode"); !slices.Equal(got, []string{string(tc.wantChosen)}) {
				t.Errorf("svcproxy_proxy_mode{mode} %v, want %s", got, tc.wantChosen)
			}
		})
	}
}

// takeOver is a successor taking the sockets offered at path, retrying
// until the daemon listens there, and saying it serves; it returns their
// names, sorted.
func takeOver(t *testing.T, path string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, names := takeSockets(ctx, t, path)
	if err := h.Ready(ctx); err != nil {
		t.Fatalf("telling the predecessor: %v", err)
	}
	return names
}

// takeSockets is a successor taking the sockets offered at path (closed
// here), retrying until the daemon listens there, and not saying it
// serves yet; it returns the handover and the sockets' names, sorted.
func takeSockets(ctx context.Context, t *testing.T, path string) (*handover.Handover, []string) {
	t.Helper()
	for {
		h, err := handover.Take(ctx, path)
		if err == nil {
			var names []string
			for name, f := range h.Files {
				names = append(names, name)
				f.Close()
			}
			slices.Sort(names)
			return h, names
		}
		if ctx.Err() != nil {
			t.Fatalf("taking over at %s: %v", path, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRunLeavesRulesToSuccessor: after a successor took over, the old
// process lingers until it is terminated (--successor-wait); meanwhile it
// neither syncs nor repairs the rules, which are the successor's now: the
// successor rewriting them (seen by the rule watcher) must not make the
// old process write its own view back.
func TestRunLeavesRulesToSuccessor(t *testing.T) {
	for _, tc := range []struct {
		mode proxymode.Name
		want []string
	}{
		{proxymode.IPTables, []string{"userspace cleanup", "ipvs cleanup", "nftables cleanup", "iptables apply full", "iptables close, handed over"}},
		// Handoverable (no steering: nothing cleaned up): the syncs stop
		// before the mode stops accepting.
		{proxymode.Userspace, []string{"userspace apply full", "userspace stop accepting", "userspace close, handed over"}},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			var mu sync.Mutex
			var calls []string
			var fails atomic.Int32
			table := recorders(&mu, &calls, &fails)
			us := table[proxymode.Userspace]
			var changed func()
			us.New = func(context.Context, map[string]*os.File) (proxymode.Mode, error) {
				return handoverable{recorder{name: proxymode.Userspace, mu: &mu, calls: &calls, fails: &fails}, func() {
					// A change noticed just as the successor is ready: the
					// syncs have stopped already.
					changed()
					time.Sleep(200 * time.Millisecond)
				}}, nil
			}
			table[proxymode.Userspace] = us
			log := zaptest.NewLogger(t)
			path := filepath.Join(t.TempDir(), "handover.sock")
			term, ctx, cancel := terminated(t, time.Minute, log) // lingers after handing over
			watched := make(chan context.Context, 1)
			cfg := Config{
				Logger: log, Registry: prometheus.NewPedanticRegistry(), Store: lb.NewStore(lb.StoreOptions{}),
				Source:  func(ctx context.Context, feed Feed) error { feed.Loaded(0, nil); <-ctx.Done(); return nil },
				Tracker: health.NewTracker(time.Minute, nil), Modes: table, Mode: tc.mode,
				IPv6:        func(context.Context, proxymode.Name) error { return nil },
				Succession:  handover.NewSuccession(path, handover.OS{NotifyRestart: func(chan<- os.Signal) error { return errors.ErrUnsupported }}, log),
				Termination: term, DrainTimeout: time.Second, SyncPeriod: time.Hour,
				WatchRules: func(ctx context.Context, _ proxymode.Name, c func()) error {
					changed = c
					watched <- ctx
					return nil
				},
			}
			done := make(chan error, 1)
			go func() { done <- Run(ctx, cfg) }()
			var watchCtx context.Context
			select {
			case watchCtx = <-watched:
			case <-time.After(10 * time.Second):
				t.Fatal("the rules were not watched within 10s")
			}
			waitForCall(t, &mu, &calls, string(tc.mode)+" apply full")
			takeOver(t, path)
			waitForCall(t, &mu, &calls, string(tc.mode)+" close, handed over")
			if watchCtx.Err() == nil {
				t.Error("still watching the rules after handing over")
			}
			changed() // the successor rewrote the rules
			time.Sleep(300 * time.Millisecond)
			select {
			case err := <-done:
				t.Fatalf("Run returned %v before it was terminated", err)
			default:
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Run = %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(calls, tc.want) {
				t.Errorf("calls %q, want %q: nothing after handing over", calls, tc.want)
			}
		})
	}
}

// TestRunLeavesTheSuccessorsRules: while a successor makes its first sync
// (it has the sockets, it has not said ready), a rule change is its own
// and not repaired, nor does a periodic sync write in full; if the
// successor fails instead, the rules are repaired once it has gone (with
// an hour's sync period, only the change seen meanwhile can ask for it).
func TestRunLeavesTheSuccessorsRules(t *testing.T) {
	for _, period := range []time.Duration{100 * time.Millisecond, time.Hour} {
		t.Run(period.String(), func(t *testing.T) { testRunLeavesTheSuccessorsRules(t, period) })
	}
}

func testRunLeavesTheSuccessorsRules(t *testing.T, period time.Duration) {
	var mu sync.Mutex
	var calls []string
	var fails atomic.Int32
	table := recorders(&mu, &calls, &fails)
	us := table[proxymode.Userspace]
	us.New = func(context.Context, map[string]*os.File) (proxymode.Mode, error) {
		return handoverable{recorder{name: proxymode.Userspace, mu: &mu, calls: &calls, fails: &fails}, func() {}}, nil
	}
	table[proxymode.Userspace] = us
	log := zaptest.NewLogger(t)
	path := filepath.Join(t.TempDir(), "handover.sock")
	term, ctx, cancel := terminated(t, 0, log)
	changed := make(chan func(), 1)
	cfg := Config{
		Logger: log, Registry: prometheus.NewPedanticRegistry(), Store: lb.NewStore(lb.StoreOptions{}),
		Source:  func(ctx context.Context, feed Feed) error { feed.Loaded(0, nil); <-ctx.Done(); return nil },
		Tracker: health.NewTracker(time.Minute, nil), Modes: table, Mode: proxymode.Userspace,
		IPv6:        func(context.Context, proxymode.Name) error { return nil },
		Succession:  handover.NewSuccession(path, handover.OS{NotifyRestart: func(chan<- os.Signal) error { return errors.ErrUnsupported }}, log),
		Termination: term, DrainTimeout: time.Second, SyncPeriod: period, MinSyncPeriod: 10 * time.Millisecond,
		WatchRules: func(_ context.Context, _ proxymode.Name, c func()) error { changed <- c; return nil },
	}
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	defer func() { cancel(); <-done }()
	fulls := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, c := range calls {
			if c == "userspace apply full" {
				n++
			}
		}
		return n
	}
	var rulesChanged func()
	select {
	case rulesChanged = <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("the rules were not watched within 10s")
	}
	waitForCall(t, &mu, &calls, "userspace apply full")
	tctx, tcancel := context.WithTimeout(ctx, 10*time.Second)
	defer tcancel()
	h, _ := takeSockets(tctx, t, path)
	for deadline := time.Now().Add(5 * time.Second); !cfg.Succession.Handing(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not handing over once the successor has the sockets")
		}
	}
	time.Sleep(50 * time.Millisecond) // a full sync in flight when the sockets went ends
	before := fulls()
	rulesChanged()                     // the successor writes its rules
	time.Sleep(500 * time.Millisecond) // periodic syncs, at 100ms
	if n := fulls() - before; n != 0 {
		t.Errorf("%d full syncs while the successor made its first one, want none", n)
	}
	h.Abandon() // the successor fails
	for deadline := time.Now().Add(5 * time.Second); fulls() == before; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no full sync after the successor failed")
		}
	}
}

// handoverable is a recorder that hands over, as the userspace mode does
// (with no sockets); StopAccepting calls onStop.
type handoverable struct {
	recorder
	onStop func()
}

func (h handoverable) Sockets() (map[string]*os.File, error) { return map[string]*os.File{}, nil }
func (h handoverable) StopAccepting() {
	h.record("stop accepting")
	h.onStop()
}

// waitForCall waits up to 10s for call among calls.
func waitForCall(t *testing.T, mu *sync.Mutex, calls *[]string, call string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		ok := slices.Contains(*calls, call)
		mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q within 10s", call)
		}
	}
}

// TestRunHandsOverHealthChecks: the health-check node ports' sockets are
// handed over with the others (a successor binding them anew would fail
// while this process holds them), and this process stops serving them
// once the successor is ready.
func TestRunHandsOverHealthChecks(t *testing.T) {
	var mu sync.Mutex
	var calls []string
	var fails atomic.Int32
	log := zaptest.NewLogger(t)
	path := filepath.Join(t.TempDir(), "handover.sock")
	term, ctx, _ := terminated(t, 0, log)
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(probe.Addr().(*net.TCPAddr).Port)
	probe.Close()
	hc := healthcheck.New(healthcheck.Config{Addresses: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, Logger: log})
	defer hc.Close()
	store := lb.NewStore(lb.StoreOptions{})
	cfg := Config{
		Logger: log, Registry: prometheus.NewPedanticRegistry(), Store: store, HealthChecks: hc,
		Source: func(ctx context.Context, feed Feed) error {
			if _, err := store.Replace([]lb.Service{{Name: lb.ServicePortName{Namespace: "ns", Name: "web", Port: "http"}, Protocol: lb.TCP, Port: 80,
				ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.5.1")}, HealthCheckNodePort: port, ExternalTrafficPolicy: lb.PolicyLocal}}); err != nil {
				return err
			}
			feed.Loaded(1, nil)
			<-ctx.Done()
			return nil
		},
		Tracker: health.NewTracker(time.Minute, nil), Modes: recorders(&mu, &calls, &fails), Mode: proxymode.IPTables,
		IPv6:        func(context.Context, proxymode.Name) error { return nil },
		Succession:  handover.NewSuccession(path, handover.OS{NotifyRestart: func(chan<- os.Signal) error { return errors.ErrUnsupported }}, log),
		Termination: term, DrainTimeout: time.Second, SyncPeriod: time.Hour,
	}
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	for deadline := time.Now().Add(10 * time.Second); len(hc.Services()) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the health check was not served within 10s")
		}
	}
	names := takeOver(t, path)
	if want := fmt.Sprintf("%s127.0.0.1:%d", healthcheck.SocketPrefix, port); !slices.Contains(names, want) {
		t.Errorf("handed over %q, want %s among them", names, want)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of the handover")
	}
	// Nobody holds the port now (the test closed its copies): the
	// handed-over process closed its listeners.
	if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
		c.Close()
		t.Error("the health-check port still accepts after the handover")
	}
}

// fwRecorder is a fake firewall: a recorder that also records the syncs
// that are not full.
type fwRecorder struct{ recorder }

func (f fwRecorder) Apply(ctx context.Context, snap *lb.Snapshot, full bool) error {
	if !full {
		f.record("apply")
	}
	return f.recorder.Apply(ctx, snap, full)
}
func (fwRecorder) Frontends() int { return 3 }

// TestRunFirewall: the loadBalancerSourceRanges firewall is applied in
// each sync before the mode; a failing firewall is logged and counted but
// neither keeps the mode from the snapshot nor fails the sync, and an
// incremental sync a second later tries it again; the process leaves it,
// handed over or not (the kernel modes' rules outlive it too).
func TestRunFirewall(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fwFails   int32
		successor bool
		want      []string
	}{
		{name: "before the mode, left after it",
			want: []string{"firewall apply full", "iptables apply full", "firewall apply", "iptables close"}},
		{name: "a failing firewall: the mode applied anyway, the firewall retried in a second", fwFails: 1,
			want: []string{"firewall apply full", "iptables apply full", "firewall apply", "iptables close"}},
		{name: "handed over: left to the successor", successor: true,
			want: []string{"firewall apply full", "iptables apply full", "firewall apply", "iptables close, handed over"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var calls []string
			var fails, fwFails atomic.Int32
			fwFails.Store(tc.fwFails)
			table := recorders(&mu, &calls, &fails)
			for name, e := range table { // the other modes' cleanups are TestRun's
				e.Cleanup = nil
				table[name] = e
			}
			logs, observed := observer.New(zap.ErrorLevel)
			log := zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), logs))
			reg := prometheus.NewPedanticRegistry()
			path := ""
			if tc.successor {
				path = filepath.Join(t.TempDir(), "handover.sock")
			}
			term, ctx, cancel := terminated(t, 0, log)
			store := lb.NewStore(lb.StoreOptions{})
			cfg := Config{
				Logger: log, Registry: reg, Store: store,
				Source:  func(ctx context.Context, feed Feed) error { feed.Loaded(0, nil); <-ctx.Done(); return nil },
				Tracker: health.NewTracker(time.Minute, nil), Modes: table, Mode: proxymode.IPTables,
				Firewall:    fwRecorder{recorder{name: "firewall", mu: &mu, calls: &calls, fails: &fwFails}},
				IPv6:        func(context.Context, proxymode.Name) error { return nil },
				Succession:  handover.NewSuccession(path, handover.OS{NotifyRestart: func(chan<- os.Signal) error { return errors.ErrUnsupported }}, log),
				Termination: term, DrainTimeout: time.Second, SyncPeriod: time.Hour,
			}
			done := make(chan error, 1)
			go func() { done <- Run(ctx, cfg) }()
			waitForCall(t, &mu, &calls, "iptables apply full")
			if tc.fwFails == 0 {
				// A change: an incremental sync, the firewall first again.
				svc := lb.Service{Name: lb.ServicePortName{Namespace: "ns", Name: "web"}, Port: 80, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}
				if _, err := store.Replace([]lb.Service{svc}); err != nil {
					t.Fatal(err)
				}
			} // else the retry
			waitForCall(t, &mu, &calls, "firewall apply")
			if got := counterValue(t, reg, "svcproxy_firewall_sync_failures_total"); got != float64(tc.fwFails) {
				t.Errorf("svcproxy_firewall_sync_failures_total = %v, want %d", got, tc.fwFails)
			}
			if got := len(observed.FilterMessageSnippet("firewall failed").All()); got != int(tc.fwFails) {
				t.Errorf("%d firewall failures logged, want %d: %v", got, tc.fwFails, observed.All())
			}
			if got := len(observed.FilterMessage("sync failed; retrying").All()); got != 0 {
				t.Errorf("a firewall failure failed the sync: %v", observed.All())
			}
			if got := counterValue(t, reg, "svcproxy_firewall_restricted_frontends"); got != 3 {
				t.Errorf("svcproxy_firewall_restricted_frontends = %v, want 3", got)
			}
			if tc.successor {
				takeOver(t, path)
			} else {
				cancel()
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Run = %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return within 10s")
			}
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(calls, tc.want) {
				t.Errorf("calls %q, want %q", calls, tc.want)
			}
		})
	}
}

// terminated is a Termination lingering linger after a handover and a
// context that it, or cancel, ends; both are stopped when t ends (cancel
// first).
func terminated(t *testing.T, linger time.Duration, log *zap.Logger) (*handover.Termination, context.Context, context.CancelFunc) {
	t.Helper()
	termCtx, term := handover.NewTermination(linger, log)
	t.Cleanup(term.Stop)
	ctx, cancel := context.WithCancel(termCtx)
	t.Cleanup(cancel)
	return term, ctx, cancel
}
