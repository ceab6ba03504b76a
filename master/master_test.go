//go:build linux

package master

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/handover"
)

// fakeWorker is a worker that exits when told (exit) or signalled.
type fakeWorker struct {
	mu   sync.Mutex
	pid  int
	exit chan error
	sigs chan os.Signal
	env  []string
}

// signal is the next signal w gets; it fails t after 5s without one.
func (w *fakeWorker) signal(t *testing.T) os.Signal {
	t.Helper()
	select {
	case s := <-w.sigs:
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("the worker got no signal")
	}
	return nil
}

// retire checks that w is told to finish (SIGTERM) and lets it exit.
func (w *fakeWorker) retire(t *testing.T, when string) {
	t.Helper()
	if s := w.signal(t); s != syscall.SIGTERM {
		t.Errorf("%s: the worker got %v, want SIGTERM", when, s)
	}
	w.exit <- nil
}

// quiet checks that w gets no signal within 100 ms.
func (w *fakeWorker) quiet(t *testing.T, when string) {
	t.Helper()
	select {
	case s := <-w.sigs:
		t.Errorf("%s: the worker got %v", when, s)
	case <-time.After(100 * time.Millisecond):
	}
}

// restarts is the EnvRestarts the worker was started with.
func (w *fakeWorker) restarts() string {
	for _, e := range w.env {
		if v, ok := strings.CutPrefix(e, EnvRestarts+"="); ok {
			return v
		}
	}
	return ""
}

func (w *fakeWorker) Pid() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pid
}
func (w *fakeWorker) Wait() error { return <-w.exit }
func (w *fakeWorker) Signal(s os.Signal) error {
	w.sigs <- s
	return nil
}

// rig runs Run with fake workers; each started worker is sent on started.
type rig struct {
	keeper  string
	signals chan os.Signal
	started chan *fakeWorker
	done    chan error
	mu      sync.Mutex
	n       int
}

// newRig runs Run; opts, if given, change its Config.
func newRig(t *testing.T, opts ...func(*Config)) *rig {
	r := &rig{keeper: filepath.Join(t.TempDir(), "keeper.sock"), signals: make(chan os.Signal, 1),
		started: make(chan *fakeWorker, 8), done: make(chan error, 1)}
	cfg := Config{Keeper: r.keeper, Signals: r.signals, Logger: zaptest.NewLogger(t),
		MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond,
		Start: func(env []string) (Worker, error) {
			r.mu.Lock()
			r.n++
			w := &fakeWorker{pid: r.n, exit: make(chan error, 1), sigs: make(chan os.Signal, 4), env: env}
			r.mu.Unlock()
			if want := EnvKeeper + "=" + r.keeper; !slices.Contains(env, want) {
				t.Errorf("worker environment %q, want %s", env, want)
			}
			r.started <- w
			return w, nil
		}}
	for _, o := range opts {
		o(&cfg)
	}
	go func() { r.done <- Run(context.Background(), cfg) }()
	return r
}

func (r *rig) next(t *testing.T) *fakeWorker {
	t.Helper()
	select {
	case w := <-r.started:
		return w
	case err := <-r.done:
		t.Fatalf("Run returned %v, want another worker", err)
	case <-time.After(5 * time.Second):
		t.Fatal("no worker started")
	}
	return nil
}

// envDeposit makes this test binary a helper that deposits a socket with
// the keeper at its value and exits (TestMain).
const envDeposit = "MASTER_TEST_DEPOSIT"

func TestMain(m *testing.M) {
	if path := os.Getenv(envDeposit); path != "" {
		f, err := os.CreateTemp("", "sock")
		if err == nil {
			os.Remove(f.Name())
			err = handover.Deposit(context.Background(), path, map[string]*os.File{"tcp/redirect/0.0.0.0:15001/0": f})
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// serve has w deposit a socket with the keeper, as a serving worker does:
// the keeper knows a depositor by its process ID, so the deposit comes
// from a helper process whose ID w takes.
func (r *rig) serve(t *testing.T, w *fakeWorker) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envDeposit+"="+r.keeper)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	w.pid = cmd.Process.Pid
	w.mu.Unlock()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("depositing: %v", err)
	}
}

// stop sends the master SIGTERM, which it must pass to w, the running
// worker; w then exits and the master returns nil.
func (r *rig) stop(t *testing.T, w *fakeWorker) {
	t.Helper()
	r.signals <- syscall.SIGTERM
	w.retire(t, "the master stopping")
	if err := r.result(t); err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
}

// noStart checks that no worker starts within 100 ms.
func (r *rig) noStart(t *testing.T, why string) {
	t.Helper()
	select {
	case w := <-r.started:
		t.Errorf("worker %d started %s", w.pid, why)
	case <-time.After(100 * time.Millisecond):
	}
}

func (r *rig) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return")
	}
	return nil
}

func TestRun(t *testing.T) {
	crash := errors.New("signal: killed")
	t.Run("a crashed worker is replaced and the next takes the kept sockets", func(t *testing.T) {
		r := newRig(t)
		w := r.next(t)
		r.serve(t, w)
		w.exit <- crash
		w2 := r.next(t)
		h, err := handover.Take(context.Background(), r.keeper)
		if err != nil {
			t.Fatal(err)
		}
		if len(h.Files) != 1 || h.Files["tcp/redirect/0.0.0.0:15001/0"] == nil {
			t.Errorf("the next worker got %v, want the deposited socket", h.Files)
		}
		if err := h.Ready(context.Background()); err != nil {
			t.Errorf("Ready: %v", err)
		}
		r.stop(t, w2)
	})
	t.Run("a crash loop ends the master", func(t *testing.T) {
		r := newRig(t, func(c *Config) { c.MaxRestarts, c.RestartWindow = 2, time.Hour })
		for i := range 3 {
			w := r.next(t)
			if got, want := w.restarts(), strconv.Itoa(i); got != want {
				t.Errorf("worker %d started with %s=%q, want %q", i, EnvRestarts, got, want)
			}
			r.serve(t, w)
			w.exit <- crash
		}
		err := r.result(t)
		if !errors.Is(err, crash) || !strings.Contains(err.Error(), "died 3 times within 1h0m0s") {
			t.Errorf("Run = %v, want the third death's error, naming the count", err)
		}
	})
	t.Run("deaths older than the window do not count", func(t *testing.T) {
		r := newRig(t, func(c *Config) { c.MaxRestarts, c.RestartWindow = 1, 50*time.Millisecond })
		for range 3 {
			w := r.next(t)
			r.serve(t, w)
			time.Sleep(60 * time.Millisecond) // past the window since the last death
			w.exit <- crash
		}
		w := r.next(t)
		if got := w.restarts(); got != "3" {
			t.Errorf("the fourth worker started with %s=%q, want 3", EnvRestarts, got)
		}
		r.stop(t, w)
	})
	t.Run("a SIGUSR2 successor that fails before it served leaves the old one serving", func(t *testing.T) {
		// The old worker answers at the handover socket: it still serves.
		handoverPath := filepath.Join(t.TempDir(), "handover.sock")
		srv, err := handover.Listen(handoverPath)
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		go srv.Serve(t.Context(), func() (map[string]*os.File, error) { return nil, nil }, func() {})
		r := newRig(t, func(c *Config) { c.Handover = handoverPath })
		w := r.next(t)
		r.serve(t, w)
		r.signals <- syscall.SIGUSR2
		r.next(t).exit <- crash
		w.quiet(t, "its successor died before taking over")
		w.exit <- crash // it is the current one again: its death is a crash
		w3 := r.next(t)
		if got := w3.restarts(); got != "1" {
			t.Errorf("its replacement started with %s=%q, want 1", EnvRestarts, got)
		}
		r.stop(t, w3)
	})
	t.Run("a SIGUSR2 successor that dies after the old one handed over to it is replaced", func(t *testing.T) {
		// Nothing answers at the handover socket: the old worker handed
		// over (it listens there no more) and drains.
		handoverPath := filepath.Join(t.TempDir(), "handover.sock")
		r := newRig(t, func(c *Config) { c.Handover = handoverPath })
		w := r.next(t)
		r.serve(t, w)
		r.signals <- syscall.SIGUSR2
		r.next(t).exit <- crash // after Ready, before its first deposit
		w3 := r.next(t)
		if got := w3.restarts(); got != "1" {
			t.Errorf("the replacement started with %s=%q, want 1 (a death)", EnvRestarts, got)
		}
		r.serve(t, w3)
		w.retire(t, "the old worker, which had handed over, once the replacement served")
		r.stop(t, w3)
	})
	t.Run("a worker made current again that was handing over to the dead successor all the same is replaced", func(t *testing.T) {
		handoverPath := filepath.Join(t.TempDir(), "handover.sock")
		srv, err := handover.Listen(handoverPath)
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(t.Context(), func() (map[string]*os.File, error) { return nil, nil }, func() {})
		r := newRig(t, func(c *Config) { c.Handover = handoverPath })
		w := r.next(t)
		r.serve(t, w)
		r.signals <- syscall.SIGUSR2
		r.next(t).exit <- crash // it sent Ready, then died; the old one still answers for a moment
		time.Sleep(100 * time.Millisecond)
		srv.Close() // ...then finishes the handover: it listens no more
		w3 := r.next(t)
		if got := w3.restarts(); got != "1" {
			t.Errorf("the replacement started with %s=%q, want 1", EnvRestarts, got)
		}
		r.serve(t, w3)
		w.retire(t, "the old worker once the replacement served")
		r.stop(t, w3)
	})
	t.Run("SIGUSR2 before the running worker served is acted on once it has", func(t *testing.T) {
		r := newRig(t)
		w := r.next(t)
		r.signals <- syscall.SIGUSR2
		r.noStart(t, "on a SIGUSR2 before the running one served")
		r.serve(t, w)
		w2 := r.next(t)
		if got := w2.restarts(); got != "0" {
			t.Errorf("the SIGUSR2 successor started with %s=%q, want 0", EnvRestarts, got)
		}
		r.serve(t, w2)
		w.retire(t, "the old worker once its successor served")
		r.noStart(t, "after the owed restart")
		r.stop(t, w2)
	})
	t.Run("SIGUSR2 while a crashed worker's replacement is due is that replacement", func(t *testing.T) {
		r := newRig(t, func(c *Config) { c.MinBackoff, c.MaxBackoff = 300*time.Millisecond, 300*time.Millisecond })
		w := r.next(t)
		r.serve(t, w)
		w.exit <- crash
		time.Sleep(50 * time.Millisecond) // the death is seen; the replacement waits out its backoff
		r.signals <- syscall.SIGUSR2
		w2 := r.next(t)
		r.serve(t, w2)
		r.noStart(t, "once the replacement, started after the SIGUSR2, served")
		r.stop(t, w2)
	})
	t.Run("SIGUSR2 while a successor has not served yet is that restart", func(t *testing.T) {
		r := newRig(t)
		w := r.next(t)
		r.serve(t, w)
		r.signals <- syscall.SIGUSR2
		w2 := r.next(t)
		r.signals <- syscall.SIGUSR2
		r.noStart(t, "on a second SIGUSR2 before the first successor served")
		r.serve(t, w2)
		w.retire(t, "the old worker once its successor served")
		r.stop(t, w2)
	})
	t.Run("a replacement that dies before it served is one more death, not the end", func(t *testing.T) {
		r := newRig(t)
		w := r.next(t)
		r.serve(t, w)
		w.exit <- crash
		r.next(t).exit <- crash // before it deposited
		w3 := r.next(t)
		if got := w3.restarts(); got != "2" {
			t.Errorf("the third worker started with %s=%q, want 2", EnvRestarts, got)
		}
		r.stop(t, w3)
	})
	t.Run("the first worker failing before it served ends the master", func(t *testing.T) {
		r := newRig(t)
		r.next(t).exit <- crash
		if err := r.result(t); !errors.Is(err, crash) {
			t.Errorf("Run = %v, want %v", err, crash)
		}
	})
	t.Run("a worker's clean exit ends the master", func(t *testing.T) {
		r := newRig(t)
		w := r.next(t)
		r.serve(t, w)
		w.exit <- nil
		if err := r.result(t); err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	})
	t.Run("SIGHUP is passed on; SIGUSR2 starts a successor and the old one's exit is no crash", func(t *testing.T) {
		r := newRig(t)
		w := r.next(t)
		r.serve(t, w)
		r.signals <- syscall.SIGHUP
		if s := w.signal(t); s != syscall.SIGHUP {
			t.Errorf("worker got %v, want SIGHUP", s)
		}
		r.signals <- syscall.SIGUSR2
		w2 := r.next(t)
		if got := w2.restarts(); got != "0" {
			t.Errorf("a SIGUSR2 successor started with %s=%q, want 0: no worker died", EnvRestarts, got)
		}
		// The old one deposits again (a sync changed its sockets) while
		// the successor starts: it must not be told to stop yet.
		pid := w.Pid()
		r.serve(t, w)
		w.quiet(t, "before its successor served")
		w.mu.Lock()
		w.pid = pid
		w.mu.Unlock()
		// The successor serves: the old one, which handed over and
		// waits to be terminated (--successor-wait), is told to finish.
		r.serve(t, w2)
		w.retire(t, "the old worker, drained, once its successor served")
		r.signals <- syscall.SIGINT
		if s := w2.signal(t); s != syscall.SIGINT {
			t.Errorf("successor got %v, want SIGINT", s)
		}
		w2.exit <- nil
		if err := r.result(t); err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
		if len(r.started) != 0 {
			t.Errorf("a worker was started after the old one exited")
		}
	})
}

// TestKeeperPath: each master gets a path of its own beside the handover
// socket, which RemoveStaleKeepers' pattern covers.
func TestKeeperPath(t *testing.T) {
	a, err := KeeperPath("/run/svcproxy/handover.sock")
	if err != nil {
		t.Fatal(err)
	}
	b, err := KeeperPath("/run/svcproxy/handover.sock")
	if err != nil {
		t.Fatal(err)
	}
	if a == b {
		t.Errorf("two masters got the same keeper path %s", a)
	}
	for _, p := range []string{a, b} {
		if ok, _ := filepath.Match(keeperPrefix("/run/svcproxy/handover.sock")+"*.sock", p); !ok || !strings.HasPrefix(p, "/run/svcproxy/handover-keeper-") {
			t.Errorf("keeper path %s: want /run/svcproxy/handover-keeper-<random>.sock", p)
		}
	}
}

// TestRemoveStaleKeepers: the handover socket's path is no pattern: a
// directory named with glob metacharacters still finds its stale keepers.
func TestRemoveStaleKeepers(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a[1]*")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "handover.sock")
	stale, err := KeeperPath(sock)
	if err != nil {
		t.Fatal(err)
	}
	k, err := handover.ListenKeeper(stale)
	if err != nil {
		t.Fatal(err)
	}
	k.Close() // removes its file: make a stale one as a killed master leaves it
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: stale, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	then := time.Now().Add(-time.Hour)
	if err := os.Chtimes(stale, then, then); err != nil {
		t.Fatal(err)
	}
	removed, err := RemoveStaleKeepers(t.Context(), sock)
	if err != nil || !slices.Equal(removed, []string{stale}) {
		t.Errorf("RemoveStaleKeepers = %v, %v; want [%s]", removed, err, stale)
	}
}
