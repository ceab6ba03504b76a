package handover

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// OS is the operating system as a Succession uses it, as tableflip keeps
// its process and signal calls behind funcs: tests replace them and fork
// nothing. Nil fields are the real ones.
type OS struct {
	Take     func(ctx context.Context, path string) (*Handover, error) // Take
	Listen   func(path string) (*Server, error)                        // Listen
	MkdirAll func(path string, perm os.FileMode) error                 // os.MkdirAll
	// NotifyRestart relays the signal that asks for a successor (SIGUSR2)
	// to c until StopRestart; an error means no such signal here.
	NotifyRestart func(c chan<- os.Signal) error
	StopRestart   func(c chan<- os.Signal) // signal.Stop
	// Executable is this process's binary (which may have been replaced
	// on disk since it started), as an absolute path, and its arguments.
	Executable func() (path string, args []string, err error)
	// StartProcess starts path with args, detached so it outlives this
	// process, writing to this process's stdout and stderr; wait reaps it.
	StartProcess func(path string, args []string) (pid int, wait func() error, err error)
	// Deposit gives a keeper copies of the sockets (Deposit).
	Deposit func(ctx context.Context, path string, files map[string]*os.File) error
	// AskMaster asks this worker's master for a new worker that takes
	// over (SIGUSR2 to the parent process).
	AskMaster func() error
}

func (o OS) withDefaults() OS {
	if o.Take == nil {
		o.Take = Take
	}
	if o.Listen == nil {
		o.Listen = Listen
	}
	if o.MkdirAll == nil {
		o.MkdirAll = os.MkdirAll
	}
	if o.Deposit == nil {
		o.Deposit = Deposit
	}
	if o.AskMaster == nil {
		o.AskMaster = askMaster
	}
	if o.NotifyRestart == nil {
		o.NotifyRestart = notifyRestart
	}
	if o.StopRestart == nil {
		o.StopRestart = func(c chan<- os.Signal) { signal.Stop(c) }
	}
	if o.Executable == nil {
		o.Executable = func() (string, []string, error) {
			exe, err := exec.LookPath(os.Args[0])
			if err == nil {
				exe, err = filepath.Abs(exe)
			}
			return exe, os.Args[1:], err
		}
	}
	if o.StartProcess == nil {
		o.StartProcess = func(path string, args []string) (int, func() error, error) {
			cmd := exec.Command(path, args...)
			cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
			cmd.SysProcAttr = detachedProcess() // outlives this process
			if err := cmd.Start(); err != nil {
				return 0, nil, err
			}
			return cmd.Process.Pid, cmd.Wait, nil
		}
	}
	return o
}

// Succession is svcproxy's part in a zero-downtime restart: taking the
// sockets of a running predecessor at start, and handing its own to a
// successor, started by SIGUSR2 (a binary replaced on disk) or arriving by
// itself (a DaemonSet's new pod).
type Succession struct {
	path string
	log  *zap.Logger
	os   OS

	from       *Handover // the predecessor, until it has let go
	readyOnce  sync.Once
	listening  chan struct{} // closed once a successor can take over
	handedOver chan struct{} // closed when a successor has taken over

	// keeper is the master's Keeper in master-worker mode ("": none):
	// sockets are taken from it when no predecessor runs, and deposited
	// with it whenever they change.
	keeper       string
	depositMu    sync.Mutex
	depositedGen uint64
	deposited    bool

	// restart asks RestartOnSignal's loop for a successor, as SIGUSR2
	// does; nil until that loop runs.
	restart atomic.Pointer[chan struct{}]
	// restartPending: Restart was asked for and not passed on yet.
	restartPending atomic.Bool
	// depositedOnce: a deposit reached the master (deposited, read
	// without depositMu, which a deposit holds for up to 10 s).
	depositedOnce atomic.Bool
	// srv listens for a successor, once Serving has started it.
	srv atomic.Pointer[Server]
}

// WithKeeper makes s a worker of a master whose Keeper listens at path:
// at start, with no predecessor to take over from, it takes the sockets
// the keeper holds (a crashed worker's), and Deposit keeps the keeper's
// copy current. SIGUSR2 is then the master's to handle. It returns s.
func (s *Succession) WithKeeper(path string) *Succession {
	s.keeper = path
	return s
}

// Deposit gives the keeper, if there is one, a copy of the sockets
// sockets returns, unless it holds generation gen already (the mode's
// count of socket changes; an unchanged count costs nothing). Call it
// after each sync, once serving.
func (s *Succession) Deposit(ctx context.Context, sockets func() (map[string]*os.File, error), gen uint64) {
	if s.keeper == "" || sockets == nil {
		return
	}
	defer s.restartIfReady() // after the unlock: a restart waits for a deposit
	s.depositMu.Lock()
	defer s.depositMu.Unlock()
	if s.deposited && s.depositedGen == gen {
		return
	}
	files, err := sockets()
	if err != nil {
		s.log.Warn("cannot copy the sockets for the master; a crash now would refuse connections until the restart", zap.Error(err))
		return
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.os.Deposit(dctx, s.keeper, files); err != nil {
		if ctx.Err() != nil {
			return // stopping: a successor or the master's next worker has them
		}
		s.log.Warn("cannot deposit the sockets with the master; a crash now would refuse connections until the restart", zap.Error(err))
		return
	}
	s.deposited, s.depositedGen = true, gen
	s.depositedOnce.Store(true)
	s.log.Debug("deposited the sockets with the master", zap.Int("sockets", len(files)), zap.Uint64("generation", gen))
}

// TakeOverPatience is how long a starting svcproxy keeps trying to take
// over from a predecessor that answers but does not hand over (busy with
// another successor, which may take minutes over its first sync; or
// failing). Then it gives up and exits rather than serve beside it.
const TakeOverPatience = 2 * time.Minute

// NewSuccession returns the succession over the handover socket at path
// ("": restarts are not seamless, nothing is taken over or offered), with
// os's calls (the zero OS: the real ones).
func NewSuccession(path string, sys OS, log *zap.Logger) *Succession {
	return &Succession{path: path, log: log, os: sys.withDefaults(), listening: make(chan struct{}), handedOver: make(chan struct{})}
}

// TakeOver takes the sockets of a running svcproxy at the path, if one
// answers. With no predecessor (nothing at the path, or a stale socket
// file) it returns no sockets and the caller binds anew. A predecessor
// that answers but does not hand over within patience is an error:
// binding anew beside it would leave two processes serving, each with its
// own rules and drains, and the old one never exiting.
func (s *Succession) TakeOver(ctx context.Context, patience time.Duration) (map[string]*os.File, error) {
	if s.path == "" {
		return nil, nil
	}
	log := s.log
	if err := s.os.MkdirAll(filepath.Dir(s.path), 0o700); err != nil {
		log.Warn("cannot create the handover directory; restarts will not be seamless", zap.Error(err))
		return nil, nil
	}
	deadline := time.Now().Add(patience)
	for attempt := 1; ; attempt++ {
		tctx, cancel := context.WithTimeout(ctx, min(10*time.Second, max(time.Until(deadline), time.Millisecond)))
		h, err := s.os.Take(tctx, s.path)
		cancel()
		switch {
		case errors.Is(err, ErrNoPredecessor):
			if attempt > 1 {
				log.Info("the running svcproxy went away before handing over; binding anew")
			}
			return s.takeFromKeeper(ctx)
		case err == nil:
			log.Info("taking over the sockets of the running svcproxy", zap.Int("sockets", len(h.Files)))
			s.from = h
			return h.Files, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("taking over from the running svcproxy at %s (%d attempts in %v): %w; "+
				"refusing to serve beside it: stop it, or start this one with another --handover-socket",
				s.path, attempt, patience, err)
		}
		log.Warn("the running svcproxy answered but did not hand over; trying again", zap.Int("attempt", attempt), zap.Error(err))
		select {
		case <-ctx.Done():
		case <-time.After(min(time.Second, time.Until(deadline))):
		}
	}
}

// takeFromKeeper takes the sockets the master's keeper holds, if s is a
// worker: those of the worker before, which crashed. None held, or no
// keeper, and the caller binds anew.
func (s *Succession) takeFromKeeper(ctx context.Context) (map[string]*os.File, error) {
	if s.keeper == "" {
		return nil, nil
	}
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	h, err := s.os.Take(tctx, s.keeper)
	cancel()
	switch {
	case errors.Is(err, ErrNoPredecessor):
		s.log.Warn("no master answers at its keeper socket; binding anew", zap.String("keeper", s.keeper))
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("taking the sockets the master keeps: %w", err)
	}
	if len(h.Files) > 0 {
		s.log.Info("taking over the sockets the master kept from the previous worker", zap.Int("sockets", len(h.Files)))
	}
	s.from = h
	return h.Files, nil
}

// Serving is called once the dataplane serves: the predecessor, if any,
// stops accepting and drains, and this process starts listening for its
// own successor. sockets and stopAccepting are the dataplane's; nil
// sockets means the mode cannot hand over (kernel modes need not: their
// rules outlive the process).
func (s *Succession) Serving(ctx context.Context, sockets func() (map[string]*os.File, error), stopAccepting func()) {
	s.readyOnce.Do(func() {
		if s.from != nil {
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := s.from.Ready(rctx)
			cancel()
			if err != nil {
				s.log.Warn("predecessor did not confirm the handover", zap.Error(err))
			} else {
				s.log.Info("predecessor stopped accepting; it drains and exits")
			}
			s.from = nil
		}
		if s.path == "" || sockets == nil {
			return
		}
		srv, err := s.os.Listen(s.path)
		if err != nil {
			s.log.Warn("cannot listen for a successor; restarts will not be seamless", zap.Error(err))
			return
		}
		s.srv.Store(srv)
		close(s.listening)
		go func() {
			defer srv.Close()
			if err := srv.Serve(ctx, sockets, stopAccepting); err == nil {
				close(s.handedOver)
			}
		}()
	})
	s.restartIfReady()
}

// Handing reports whether a successor has this process's sockets and is
// making its first sync (Server.Handing): rule changes meanwhile are its
// own, and repairing them would write this process's rules over them.
func (s *Succession) Handing() bool {
	srv := s.srv.Load()
	return srv != nil && srv.Handing()
}

// HandedOver is closed when a successor has taken over.
func (s *Succession) HandedOver() <-chan struct{} { return s.handedOver }

// RestartOnSignal starts this process's binary (which may have been
// replaced) with the same arguments on every SIGUSR2, until ctx ends; the
// new process takes over through the handover socket.
func (s *Succession) RestartOnSignal(ctx context.Context) {
	if s.keeper != "" {
		ignoreRestart() // a worker's successor is its master's to start
		return
	}
	exe, args, err := s.os.Executable()
	if err != nil {
		s.log.Warn("cannot find svcproxy's own binary; SIGUSR2 restarts are off", zap.Error(err))
		return
	}
	sig := make(chan os.Signal, 1)
	if err := s.os.NotifyRestart(sig); err != nil {
		s.log.Debug("SIGUSR2 restarts are off", zap.Error(err))
		return
	}
	asked := make(chan struct{}, 1)
	s.restart.Store(&asked)
	go func() {
		defer s.os.StopRestart(sig)
		defer s.restart.Store(nil)
		for {
			select {
			case <-ctx.Done():
				return
			case <-sig:
			case <-asked:
			}
			pid, wait, err := s.os.StartProcess(exe, args)
			if err != nil {
				s.log.Error("starting successor", zap.String("binary", exe), zap.Error(err))
				continue
			}
			s.log.Info("started successor", zap.String("binary", exe), zap.Int("pid", pid))
			go func() { _ = wait() }()
		}
	}()
}

// Restart asks for what SIGUSR2 starts, for a reason of the process's
// own: a successor that takes over through the handover socket (under a
// master, the master's new worker). It returns at once; the request is
// passed on as soon as a successor can take over: once this process
// listens for one (Serving), or, under a master (which ignores SIGUSR2
// before), has deposited its sockets; while a successor is taking over
// it waits (the next Serving, after a sync, passes it on if that one
// failed), and once one has, it is dropped (the successor is the
// restart). An error says restarts cannot work here (no handover socket,
// no SIGUSR2 handling): the caller must restart some other way.
func (s *Succession) Restart() error {
	switch {
	case s.keeper != "":
	case s.path == "":
		return errors.New("restarting: the handover socket is off (--handover-socket), so a successor could not take the sockets over")
	case s.restart.Load() == nil:
		return errors.New("restarting: restarts are off here (no SIGUSR2 handling)")
	}
	s.restartPending.Store(true)
	s.restartIfReady()
	return nil
}

// restartIfReady passes a pending Restart on if a successor can take over
// now (see Restart); failures are logged.
func (s *Succession) restartIfReady() {
	if !s.restartPending.Load() {
		return
	}
	select {
	case <-s.handedOver:
		s.restartPending.Store(false)
		return
	default:
	}
	if s.Handing() {
		return
	}
	if s.keeper != "" {
		if !s.depositedOnce.Load() || !s.restartPending.CompareAndSwap(true, false) {
			return
		}
		if err := s.os.AskMaster(); err != nil {
			s.log.Error("cannot ask the master for a new worker", zap.Error(err))
		}
		return
	}
	if s.srv.Load() == nil || !s.restartPending.CompareAndSwap(true, false) {
		return
	}
	asked := s.restart.Load()
	if asked == nil {
		s.log.Error("cannot restart: restarts are off (no SIGUSR2 handling)")
		return
	}
	select {
	case *asked <- struct{}{}:
	default: // one is asked for already
	}
}

// Termination decides when a termination signal ends svcproxy. SIGINT, and
// SIGTERM with no successor wait, end it at once (ctx is cancelled). With
// a successor wait (--successor-wait, for a DaemonSet that starts the new
// pod before it stops the old one), SIGTERM to a process that can hand
// over keeps it serving until a successor takes over, so the node is never
// left unsteered: the successor gets the sockets and the rules, and ctx
// stays uncancelled (svcproxy's own select sees the handover). If no
// successor comes within the wait, ctx is cancelled and svcproxy exits as
// before: a clean exit, rules removed in userspace mode (an uninstall).
type Termination struct {
	wait time.Duration // 0: no successor wait
	log  *zap.Logger
	sig  chan os.Signal

	cancel     context.CancelFunc
	once       sync.Once
	terminated chan struct{} // closed on the first SIGTERM or SIGINT

	mu   sync.Mutex
	succ *Succession
}

// NotifyTermination returns the daemon's context and its termination,
// taking SIGTERM and SIGINT from now on; stop releases the signals.
func NotifyTermination(wait time.Duration, log *zap.Logger) (ctx context.Context, stop context.CancelFunc, t *Termination) {
	ctx, t = NewTermination(wait, log)
	signal.Notify(t.sig, syscall.SIGTERM, syscall.SIGINT)
	return ctx, t.Stop, t
}

// Stop releases the signals and cancels the daemon's context: svcproxy
// ends, and a further signal has its default effect.
func (t *Termination) Stop() {
	signal.Stop(t.sig)
	t.cancel()
}

// NewTermination is NotifyTermination without the process's signals:
// they arrive through Signal.
func NewTermination(wait time.Duration, log *zap.Logger) (context.Context, *Termination) {
	ctx, cancel := context.WithCancel(context.Background())
	t := &Termination{wait: wait, log: log, sig: make(chan os.Signal, 2), cancel: cancel, terminated: make(chan struct{})}
	go t.run(ctx)
	return ctx, t
}

// Signal delivers s as if the process had received it.
func (t *Termination) Signal(s os.Signal) { t.sig <- s }

// Follow names the succession whose handover a SIGTERM waits for.
func (t *Termination) Follow(s *Succession) {
	t.mu.Lock()
	t.succ = s
	t.mu.Unlock()
}

func (t *Termination) run(ctx context.Context) {
	var s os.Signal
	select {
	case <-ctx.Done():
		return
	case s = <-t.sig:
	}
	t.once.Do(func() { close(t.terminated) })
	t.mu.Lock()
	succ := t.succ
	t.mu.Unlock()
	if s != syscall.SIGTERM || t.wait <= 0 || succ == nil {
		t.cancel()
		return
	}
	select {
	case <-succ.listening:
	default: // not serving yet, or cannot hand over: nothing to wait for
		t.cancel()
		return
	}
	select {
	case <-succ.handedOver:
		return // already handed over: draining, then Linger returns
	default:
	}
	t.log.Info("SIGTERM: serving on until a successor takes over", zap.Duration("successorWait", t.wait))
	timer := time.NewTimer(t.wait)
	defer timer.Stop()
	select {
	case <-succ.handedOver:
	case <-timer.C:
		t.log.Info("no successor took over; exiting", zap.Duration("successorWait", t.wait))
		t.cancel()
	case <-t.sig: // a second signal: go now
		t.cancel()
	case <-ctx.Done():
	}
}

// Linger keeps a process that has handed over and drained alive until it
// is told to terminate, when there is a successor wait: kubelet restarts
// a container whose process exits, and the restarted old version would
// take the sockets back from its successor. Without a successor wait
// (SIGUSR2 restarts, systemd) it returns at once.
func (t *Termination) Linger(ctx context.Context) {
	if t.wait <= 0 {
		return
	}
	t.log.Info("handed over and drained; waiting to be terminated")
	select {
	case <-t.terminated:
	case <-ctx.Done():
	}
}
