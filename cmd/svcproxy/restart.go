package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/handover"
)

// succession is svcproxy's part in a zero-downtime restart (package
// handover): taking the sockets of a running predecessor at start, and
// handing its own to a successor, started by SIGUSR2 (a binary replaced on
// disk) or arriving by itself (a DaemonSet's new pod).
type succession struct {
	path string
	log  *zap.Logger

	from       *handover.Handover // the predecessor, until it has let go
	readyOnce  sync.Once
	listening  chan struct{} // closed once a successor can take over
	handedOver chan struct{} // closed when a successor has taken over
}

// takeOverPatience is how long a starting svcproxy keeps trying to take
// over from a predecessor that answers but does not hand over (busy with
// another successor, which may take minutes over its first sync; or
// failing). Then it gives up and exits rather than serve beside it.
const takeOverPatience = 2 * time.Minute

// takeOver takes the sockets of a running svcproxy at path, if one answers.
// With no predecessor (nothing at path, or a stale socket file) it returns
// no sockets and the caller binds anew. A predecessor that answers but does
// not hand over within patience is an error: binding anew beside it would
// leave two processes serving, each with its own rules and drains, and the
// old one never exiting.
func takeOver(ctx context.Context, path string, patience time.Duration, log *zap.Logger) (*succession, map[string]*os.File, error) {
	s := &succession{path: path, log: log, listening: make(chan struct{}), handedOver: make(chan struct{})}
	if path == "" {
		return s, nil, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		log.Warn("cannot create the handover directory; restarts will not be seamless", zap.Error(err))
		return s, nil, nil
	}
	deadline := time.Now().Add(patience)
	for attempt := 1; ; attempt++ {
		tctx, cancel := context.WithTimeout(ctx, min(10*time.Second, max(time.Until(deadline), time.Millisecond)))
		h, err := handover.Take(tctx, path)
		cancel()
		switch {
		case errors.Is(err, handover.ErrNoPredecessor):
			if attempt > 1 {
				log.Info("the running svcproxy went away before handing over; binding anew")
			}
			return s, nil, nil
		case err == nil:
			log.Info("taking over the sockets of the running svcproxy", zap.Int("sockets", len(h.Files)))
			s.from = h
			return s, h.Files, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, nil, fmt.Errorf("taking over from the running svcproxy at %s (%d attempts in %v): %w; "+
				"refusing to serve beside it: stop it, or start this one with another --handover-socket",
				path, attempt, patience, err)
		}
		log.Warn("the running svcproxy answered but did not hand over; trying again", zap.Int("attempt", attempt), zap.Error(err))
		select {
		case <-ctx.Done():
		case <-time.After(min(time.Second, time.Until(deadline))):
		}
	}
}

// serving is called once the dataplane serves: the predecessor, if any,
// stops accepting and drains, and this process starts listening for its
// own successor. sockets and stopAccepting are the dataplane's; nil means
// the mode cannot hand over (kernel modes need not: their rules outlive
// the process).
func (s *succession) serving(ctx context.Context, sockets func() (map[string]*os.File, error), stopAccepting func()) {
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
		srv, err := handover.Listen(s.path)
		if err != nil {
			s.log.Warn("cannot listen for a successor; restarts will not be seamless", zap.Error(err))
			return
		}
		close(s.listening)
		go func() {
			defer srv.Close()
			if err := srv.Serve(ctx, sockets, stopAccepting); err == nil {
				close(s.handedOver)
			}
		}()
	})
}

// startSuccessorOnSIGUSR2 starts the binary at svcproxy's path (which may
// have been replaced) with the same arguments on every SIGUSR2; the new
// process takes over through the handover socket.
func startSuccessorOnSIGUSR2(ctx context.Context, log *zap.Logger) {
	exe, err := exec.LookPath(os.Args[0])
	if err == nil {
		exe, err = filepath.Abs(exe)
	}
	if err != nil {
		log.Warn("cannot find svcproxy's own binary; SIGUSR2 restarts are off", zap.Error(err))
		return
	}
	sig := make(chan os.Signal, 1)
	if err := notifyRestart(sig); err != nil {
		log.Debug("SIGUSR2 restarts are off", zap.Error(err))
		return
	}
	go func() {
		defer signal.Stop(sig)
		for {
			select {
			case <-ctx.Done():
				return
			case <-sig:
			}
			cmd := exec.Command(exe, os.Args[1:]...)
			cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
			cmd.SysProcAttr = detachedProcess() // outlives this process
			if err := cmd.Start(); err != nil {
				log.Error("starting successor", zap.String("binary", exe), zap.Error(err))
				continue
			}
			log.Info("started successor", zap.String("binary", exe), zap.Int("pid", cmd.Process.Pid))
			go func() { _ = cmd.Wait() }()
		}
	}()
}

// termination decides when a termination signal ends svcproxy. SIGINT, and
// SIGTERM with no successor wait, end it at once (ctx is cancelled). With
// a successor wait (--successor-wait, for a DaemonSet that starts the new
// pod before it stops the old one), SIGTERM to a process that can hand
// over keeps it serving until a successor takes over, so the node is never
// left unsteered: the successor gets the sockets and the rules, and ctx
// stays uncancelled (svcproxy's own select sees the handover). If no
// successor comes within the wait, ctx is cancelled and svcproxy exits as
// before: a clean exit, rules removed in userspace mode (an uninstall).
type termination struct {
	wait time.Duration // 0: no successor wait
	log  *zap.Logger
	sig  chan os.Signal

	cancel     context.CancelFunc
	once       sync.Once
	terminated chan struct{} // closed on the first SIGTERM or SIGINT

	mu   sync.Mutex
	succ *succession
}

// notifyTermination returns the daemon's context and its termination,
// taking SIGTERM and SIGINT from now on; stop releases the signals.
func notifyTermination(wait time.Duration, log *zap.Logger) (ctx context.Context, stop context.CancelFunc, t *termination) {
	ctx, t = newTermination(wait, log)
	signal.Notify(t.sig, syscall.SIGTERM, syscall.SIGINT)
	return ctx, func() { signal.Stop(t.sig); t.cancel() }, t
}

// newTermination is notifyTermination without the process's signals:
// signals arrive on t.sig.
func newTermination(wait time.Duration, log *zap.Logger) (context.Context, *termination) {
	ctx, cancel := context.WithCancel(context.Background())
	t := &termination{wait: wait, log: log, sig: make(chan os.Signal, 2), cancel: cancel, terminated: make(chan struct{})}
	go t.run(ctx)
	return ctx, t
}

// follow names the succession whose handover a SIGTERM waits for.
func (t *termination) follow(s *succession) {
	t.mu.Lock()
	t.succ = s
	t.mu.Unlock()
}

func (t *termination) run(ctx context.Context) {
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
		return // already handed over: draining, then linger returns
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

// linger keeps a process that has handed over and drained alive until it
// is told to terminate, when there is a successor wait: kubelet restarts
// a container whose process exits, and the restarted old version would
// take the sockets back from its successor. Without a successor wait
// (SIGUSR2 restarts, systemd) it returns at once.
func (t *termination) linger(ctx context.Context) {
	if t.wait <= 0 {
		return
	}
	t.log.Info("handed over and drained; waiting to be terminated")
	select {
	case <-t.terminated:
	case <-ctx.Done():
	}
}
