package handover

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestTakeOver: a starting svcproxy binds anew only when no predecessor
// runs; one that answers but will not hand over makes it give up rather
// than serve beside it.
func TestTakeOver(t *testing.T) {
	// mute answers at path and closes every connection at once: a
	// predecessor that is there but hands nothing over. It stops after
	// accepting limit connections (0: never), leaving no socket file.
	mute := func(t *testing.T, path string, limit int) {
		ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			defer ln.Close()
			for n := 1; ; n++ {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
				if n == limit {
					return
				}
			}
		}()
	}
	for _, tc := range []struct {
		name    string
		setup   func(t *testing.T, path string) // the predecessor, if any
		off     bool                            // --handover-socket=""
		files   int                             // sockets taken over
		wantErr string
	}{
		{name: "off", off: true},
		{name: "nothing at the path", setup: func(*testing.T, string) {}},
		{name: "a stale socket file", setup: func(t *testing.T, path string) {
			ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
			if err != nil {
				t.Fatal(err)
			}
			ln.SetUnlinkOnClose(false)
			ln.Close()
			if _, err := os.Stat(path); err != nil {
				t.Fatalf("the stale socket file is gone: %v", err)
			}
		}},
		{name: "a predecessor that answers and never hands over",
			setup:   func(t *testing.T, path string) { mute(t, path, 0) },
			wantErr: "refusing to serve beside it"},
		{name: "a predecessor that fails once and goes away",
			setup: func(t *testing.T, path string) { mute(t, path, 1) }},
		{name: "a predecessor that hands over", files: 1, setup: func(t *testing.T, path string) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			srv, err := Listen(path)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			go func() {
				defer srv.Close()
				_ = srv.Serve(ctx, func() (map[string]*os.File, error) {
					f, err := ln.(*net.TCPListener).File()
					return map[string]*os.File{"tcp/127.0.0.1:1": f}, err
				}, func() {})
			}()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "handover.sock")
			if tc.setup != nil {
				tc.setup(t, path)
			}
			if tc.off {
				path = ""
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			s := NewSuccession(path, OS{}, zap.NewNop())
			files, err := s.TakeOver(ctx, 1500*time.Millisecond)
			for _, f := range files {
				defer f.Close()
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("TakeOver: %v, want an error saying %q", err, tc.wantErr)
				}
				if d := time.Since(start); d < 1500*time.Millisecond {
					t.Errorf("gave up after %v, before its patience (1.5s) ran out", d)
				}
				return
			}
			if err != nil {
				t.Fatalf("TakeOver: %v", err)
			}
			if len(files) != tc.files {
				t.Fatalf("took over %d sockets, want %d", len(files), tc.files)
			}
			if tc.files > 0 {
				if err := s.from.Ready(ctx); err != nil {
					t.Fatalf("telling the predecessor: %v", err)
				}
			}
		})
	}
}

// TestTermination: SIGTERM ends svcproxy at once unless it waits for a
// successor (--successor-wait), and a process that handed over lingers
// until it is terminated only when it waits for successors.
func TestTermination(t *testing.T) {
	type step int
	const (
		sigterm step = iota
		sigint
		handOver // the successor takes over
	)
	for _, tc := range []struct {
		name      string
		wait      time.Duration
		listening bool   // the process can hand over
		steps     []step // in order, 50ms apart
		cancelled bool   // ctx ends (the process exits without a handover)
		within    time.Duration
		lingers   bool // linger still blocks after the steps
	}{
		{name: "SIGINT ends at once", wait: time.Minute, listening: true, steps: []step{sigint}, cancelled: true, within: time.Second},
		{name: "SIGTERM without a successor wait ends at once", listening: true, steps: []step{sigterm}, cancelled: true, within: time.Second},
		{name: "SIGTERM before serving ends at once", wait: time.Minute, steps: []step{sigterm}, cancelled: true, within: time.Second},
		{name: "SIGTERM with nobody taking over ends after the wait", wait: 300 * time.Millisecond, listening: true,
			steps: []step{sigterm}, cancelled: true, within: 2 * time.Second},
		{name: "a second SIGTERM ends the wait", wait: time.Minute, listening: true, steps: []step{sigterm, sigterm}, cancelled: true, within: time.Second},
		{name: "SIGTERM, then a successor takes over: it keeps the rules", wait: time.Minute, listening: true,
			steps: []step{sigterm, handOver}},
		{name: "handed over, not yet terminated: lingers", wait: time.Minute, listening: true,
			steps: []step{handOver}, lingers: true},
		{name: "handed over, then SIGTERM: goes at once", wait: time.Minute, listening: true,
			steps: []step{handOver, sigterm}},
		{name: "handed over without a successor wait: no lingering", listening: true, steps: []step{handOver}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, term := NewTermination(tc.wait, zap.NewNop())
			defer term.cancel()
			succ := &Succession{listening: make(chan struct{}), handedOver: make(chan struct{})}
			if tc.listening {
				close(succ.listening)
			}
			term.Follow(succ)
			start := time.Now()
			for _, s := range tc.steps {
				switch s {
				case sigterm:
					term.sig <- syscall.SIGTERM
				case sigint:
					term.sig <- syscall.SIGINT
				case handOver:
					close(succ.handedOver)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if tc.cancelled {
				select {
				case <-ctx.Done():
				case <-time.After(tc.within):
					t.Fatalf("ctx not cancelled within %v", tc.within)
				}
				if tc.wait > 0 && tc.wait < time.Minute && time.Since(start) < tc.wait {
					t.Errorf("cancelled after %v, before the successor wait (%v) ran out", time.Since(start), tc.wait)
				}
				return
			}
			// Not cancelled: the handover decides, and svcproxy's own select
			// must see it rather than a cancelled ctx.
			time.Sleep(200 * time.Millisecond)
			if ctx.Err() != nil {
				t.Fatal("ctx cancelled, want it left to the handover")
			}
			lingered := make(chan struct{})
			go func() { term.Linger(ctx); close(lingered) }()
			select {
			case <-lingered:
				if tc.lingers {
					t.Fatal("linger returned before the process was terminated")
				}
			case <-time.After(300 * time.Millisecond):
				if !tc.lingers {
					t.Fatal("linger still blocks, want it to return at once")
				}
				term.sig <- syscall.SIGTERM
				select {
				case <-lingered:
				case <-time.After(time.Second):
					t.Fatal("linger did not return after SIGTERM")
				}
				if ctx.Err() != nil {
					t.Error("SIGTERM after a handover cancelled ctx, want it left to the handover")
				}
			}
		})
	}
}

// TestRestartOnSignal: each SIGUSR2 starts the binary with the process's
// arguments, a failed start is logged and the next signal tries again, and
// the signal is released when ctx ends; no process is forked (the OS
// calls are fakes).
func TestRestartOnSignal(t *testing.T) {
	type start struct {
		path string
		args []string
	}
	starts := make(chan start, 4)
	fail := make(chan bool, 4)
	var relay chan<- os.Signal
	stopped := make(chan struct{})
	sys := OS{
		Executable:    func() (string, []string, error) { return "/usr/bin/svcproxy", []string{"--proxy-mode=ipvs"}, nil },
		NotifyRestart: func(c chan<- os.Signal) error { relay = c; return nil },
		StopRestart:   func(chan<- os.Signal) { close(stopped) },
		StartProcess: func(path string, args []string) (int, func() error, error) {
			starts <- start{path, args}
			if <-fail {
				return 0, nil, errors.New("injected: exec format error")
			}
			return 4242, func() error { return nil }, nil
		},
	}
	core, logs := observer.New(zap.InfoLevel)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	NewSuccession("", sys, zap.New(core)).RestartOnSignal(ctx)
	if relay == nil {
		t.Fatal("RestartOnSignal did not ask for SIGUSR2")
	}
	for i, failing := range []bool{true, false} {
		fail <- failing
		relay <- syscall.SIGUSR2
		select {
		case s := <-starts:
			if s.path != "/usr/bin/svcproxy" || !slices.Equal(s.args, []string{"--proxy-mode=ipvs"}) {
				t.Errorf("signal %d started %s %v, want /usr/bin/svcproxy [--proxy-mode=ipvs]", i, s.path, s.args)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("signal %d started no successor", i)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for logs.FilterMessage("started successor").Len() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := logs.FilterMessage("starting successor").Len(); n != 1 {
		t.Errorf("%d errors logged for the failed start, want 1", n)
	}
	if l := logs.FilterMessage("started successor").All(); len(l) != 1 || l[0].ContextMap()["pid"] != int64(4242) {
		t.Errorf("started-successor logs %v, want one with pid 4242", l)
	}
	cancel()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("SIGUSR2 not released after ctx ended")
	}
}

// TestRestart: a restart the process asks for is refused without a
// handover socket, and otherwise waits until a successor can take over:
// until this process listens for one, or under a master until it has
// deposited its sockets (the master ignores SIGUSR2 before).
func TestRestart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := NewSuccession("", OS{}, zap.NewNop()).Restart(); err == nil {
		t.Error("Restart without a handover socket succeeded")
	}

	started := make(chan struct{}, 4)
	sys := OS{
		Executable:    func() (string, []string, error) { return "/usr/bin/svcproxy", nil, nil },
		NotifyRestart: func(chan<- os.Signal) error { return nil },
		StopRestart:   func(chan<- os.Signal) {},
		StartProcess: func(string, []string) (int, func() error, error) {
			started <- struct{}{}
			return 4242, func() error { return nil }, nil
		},
	}
	s := NewSuccession(filepath.Join(t.TempDir(), "handover.sock"), sys, zap.NewNop())
	s.RestartOnSignal(ctx)
	if err := s.Restart(); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	select {
	case <-started:
		t.Fatal("a successor started before this process listened for one")
	case <-time.After(50 * time.Millisecond):
	}
	s.Serving(ctx, func() (map[string]*os.File, error) { return map[string]*os.File{}, nil }, func() {})
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("no successor started once this process listened for one")
	}

	asked := 0
	deposited := false
	m := NewSuccession("", OS{
		AskMaster: func() error { asked++; return nil },
		Deposit:   func(context.Context, string, map[string]*os.File) error { deposited = true; return nil },
	}, zap.NewNop()).WithKeeper("/run/keeper.sock")
	if err := m.Restart(); err != nil || asked != 0 {
		t.Fatalf("Restart under a master before a deposit = %v, master asked %d times; want nil, not yet", err, asked)
	}
	m.Deposit(ctx, func() (map[string]*os.File, error) { return map[string]*os.File{}, nil }, 1)
	if !deposited || asked != 1 {
		t.Errorf("after the deposit (%v) the master was asked %d times, want once", deposited, asked)
	}
	m.Deposit(ctx, func() (map[string]*os.File, error) { return map[string]*os.File{}, nil }, 2)
	if asked != 1 {
		t.Errorf("the master was asked %d times for one Restart", asked)
	}
}
