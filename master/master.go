//go:build linux

// Package master owns master-worker mode (--master-worker): a small
// process that starts the svcproxy that serves (the worker) as its child,
// keeps a copy of the worker's sockets in a handover.Keeper, and, when the
// worker dies, starts another that takes those sockets. The listening
// sockets never close, so while no worker runs, new connections wait in
// their accept queues (and datagrams in their receive buffers) instead of
// being refused: the crash costs only what was in flight in the dead
// worker. HAProxy's master-worker mode and nginx's master process are the
// anchors; like HAProxy's master, this one does no proxying and holds no
// configuration, so it has little that can crash.
//
// Signals to the master: SIGINT and SIGTERM stop it (the worker is told
// and the master exits with it; the kept sockets are closed at once, so
// new connections are refused rather than queued while the worker
// drains); SIGHUP is passed on; SIGUSR2 starts a new worker, which takes
// over from the running one through the handover socket as on any
// restart, and once it serves the master sends the old one SIGTERM (which
// with --successor-wait waits for it after draining). A new worker that
// fails before it took over (the old one still answers at the handover
// socket) leaves the old one serving, watched for 30s in case it was
// finishing the handover all the same; one that fails after is replaced
// as a crashed worker is. A SIGUSR2 while the running worker has not
// served yet is acted on once it has (or is the restart a crashed
// worker's replacement starting after it makes); one while a SIGUSR2
// successor is starting is that restart. A worker that exits
// with status 0 by itself (it handed over to a successor outside this
// master, as in a DaemonSet rollout) ends the master too. A worker has
// served once it deposited its sockets with the keeper (which knows the
// depositor from the unix socket's peer credentials). If the first worker
// fails before it served, its error is the master's (a configuration that
// never worked); a later one that does is a death like any other. A worker
// that dies more often than Config.MaxRestarts allows is not replaced
// either: the master then exits with its error, so
// that a crash loop reaches whoever restarts the master (kubelet's
// CrashLoopBackOff, systemd) instead of being hidden by it; each worker
// learns how many it replaced (EnvRestarts) and exports it.
//
// Every master keeps its sockets at a path of its own (KeeperPath): during
// a DaemonSet rollout two masters run on the node at once, and the new
// one's worker must deposit with the new one. As a container's PID 1 the
// master inherits the processes a dead worker left running, and reaps them
// when they exit.
package master

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/handover"
)

// EnvKeeper is the environment variable that tells a worker where its
// master's keeper listens (and that it is a worker).
const EnvKeeper = "SVCPROXY_KEEPER"

// EnvRestarts tells a worker how many workers that died its master has
// replaced so far.
const EnvRestarts = "SVCPROXY_WORKER_RESTARTS"

// KeeperPath returns a keeper socket path of a master's own beside the
// workers' handover socket: <handover socket without .sock>-keeper-<random>.sock.
// Random, not the process ID: every pod's master is PID 1 in its own PID
// namespace, and the directory is the node's.
func KeeperPath(handoverSocket string) (string, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("naming the keeper socket: %w", err)
	}
	return fmt.Sprintf("%s-%x.sock", keeperPrefix(handoverSocket), b), nil
}

// RemoveStaleKeepers removes the keeper sockets beside handoverSocket that
// masters killed before they could clean up left behind (and the single
// path every master shared before KeeperPath, if nobody answers there).
func RemoveStaleKeepers(ctx context.Context, handoverSocket string) ([]string, error) {
	return handover.RemoveStaleKeepers(ctx, escapeGlob(keeperPrefix(handoverSocket))+"*.sock", time.Minute)
}

// escapeGlob quotes filepath.Match's metacharacters in s.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

func keeperPrefix(handoverSocket string) string {
	return strings.TrimSuffix(handoverSocket, ".sock") + "-keeper"
}

// Worker is a started worker process.
type Worker interface {
	Pid() int
	// Wait waits for it to exit: nil for status 0.
	Wait() error
	Signal(os.Signal) error
}

// Config configures Run.
type Config struct {
	// Keeper is the unix socket path of the keeper. Required.
	Keeper string
	// Handover is the workers' handover socket: a worker that still
	// answers there serves (it has not handed over). "": assume it does.
	Handover string
	// Start starts a worker with env added to this process's environment.
	// Required.
	Start func(env []string) (Worker, error)
	// Signals are the signals the master acts on (SIGINT, SIGTERM, SIGHUP,
	// SIGUSR2), relayed by the caller.
	Signals <-chan os.Signal
	// MinBackoff and MaxBackoff bound the wait before restarting a worker
	// that died soon (under StableAfter) after it started; it doubles on
	// each such death. Zero: 100ms, 5s, 10s.
	MinBackoff, MaxBackoff, StableAfter time.Duration
	// MaxRestarts is how many workers that died the master replaces within
	// any RestartWindow; the next death ends it. Zero: 3 in 10 minutes;
	// negative: none (the first death ends it, as HAProxy's master does).
	MaxRestarts   int
	RestartWindow time.Duration
	// Logger; nil: no logging.
	Logger *zap.Logger
}

// reapEvery is how often the master looks for orphans to reap.
const reapEvery = 10 * time.Second

// fallBackWatch is how long a worker made current again is watched for a
// handover it was finishing to a successor that died.
const fallBackWatch = 30 * time.Second

// errHandedOverToDead is the "death" of a worker that handed over to a
// successor which then died: it no longer serves.
var errHandedOverToDead = errors.New("handed over to a successor that died before serving")

type exit struct {
	w   Worker
	err error
}

// Run starts a worker and keeps one running until ctx ends, a stop signal
// or a worker's own clean exit, as the package comment says. It returns
// the last worker's error, if any.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = 5 * time.Second
	}
	if cfg.StableAfter == 0 {
		cfg.StableAfter = 10 * time.Second
	}
	if cfg.MaxRestarts == 0 {
		cfg.MaxRestarts = 3
	}
	if cfg.RestartWindow == 0 {
		cfg.RestartWindow = 10 * time.Minute
	}
	k, err := handover.ListenKeeper(cfg.Keeper)
	if err != nil {
		return fmt.Errorf("master-worker: %w", err)
	}
	kctx, stopKeeper := context.WithCancel(context.Background())
	defer func() { stopKeeper(); k.Close() }()
	go func() { _ = k.Serve(kctx) }()

	exits := make(chan exit, 4)
	live := map[Worker]bool{}
	var current Worker
	var started time.Time
	var retiring Worker    // the worker a SIGUSR2 successor replaces, told to stop once that serves
	var deaths []time.Time // of workers replaced, within RestartWindow
	restarts := 0          // workers replaced
	// fellBack is a worker made current again when its SIGUSR2 successor
	// died before serving, watched until fellBackUntil in case it was
	// handing over to the dead one all the same.
	var fellBack Worker
	var fellBackUntil time.Time
	fallBackTick := time.NewTicker(time.Hour)
	fallBackTick.Stop()
	defer fallBackTick.Stop()
	// A worker served once it deposited its sockets (the keeper knows who
	// deposited from the unix socket's peer credentials).
	served := func(w Worker) bool { return k.Served(w.Pid()) }
	everServed := false // some worker did: its configuration works
	// owed is a SIGUSR2 that came before the running worker served: a
	// new worker starts once it has, unless one starts meanwhile anyway
	// (a crashed worker's replacement is as new as the operator asked).
	owed := false
	start := func() error {
		w, err := cfg.Start([]string{EnvKeeper + "=" + cfg.Keeper, fmt.Sprintf("%s=%d", EnvRestarts, restarts)})
		if err != nil {
			return fmt.Errorf("starting a worker: %w", err)
		}
		owed = false
		k.Forget(w.Pid()) // a dead worker's late deposit may have marked a PID reused now
		current, started, live[w] = w, time.Now(), true
		log.Info("started a worker", zap.Int("pid", w.Pid()))
		go func() { exits <- exit{w, w.Wait()} }()
		return nil
	}
	if err := start(); err != nil {
		return err
	}

	stopping := false
	stop := func(sig os.Signal) {
		if !stopping {
			stopping = true
			// No new worker will take the kept sockets: close them, so
			// that while the worker drains, new connections are refused
			// (its listeners closed) rather than queued for nobody.
			stopKeeper()
			k.Close()
		}
		for w := range live {
			_ = w.Signal(sig)
		}
	}
	backoff := time.Duration(0)
	var restart <-chan time.Time
	// replace starts a SIGUSR2 successor of the running worker, which has
	// served: once the successor serves, the old one is told to finish.
	replace := func() {
		log.Info("SIGUSR2: starting a new worker; it takes over from the running one")
		prev := current
		if err := start(); err != nil {
			log.Error("restarting", zap.Error(err))
			return
		}
		if live[prev] {
			retiring = prev
		}
	}
	// ready says whether a SIGUSR2 can start a successor now.
	ready := func() bool {
		return !stopping && restart == nil && retiring == nil && fellBack == nil && served(current)
	}
	// As PID 1 of a container the master inherits whatever a dead worker
	// left running; reap those once they exit.
	reap := time.NewTicker(reapEvery)
	defer reap.Stop()
	reapNow := func() {
		keep := map[int]bool{}
		for w := range live {
			keep[w.Pid()] = true
		}
		if pids := reapOrphans(keep); len(pids) > 0 {
			log.Info("reaped processes a worker left behind", zap.Ints("pids", pids))
		}
	}
	// died counts the current worker's death and schedules its
	// replacement, or ends the master past MaxRestarts.
	died := func(w Worker, werr error) error {
		now := time.Now()
		deaths = slices.DeleteFunc(deaths, func(d time.Time) bool { return now.Sub(d) >= cfg.RestartWindow })
		if len(deaths) >= cfg.MaxRestarts {
			stop(syscall.SIGTERM)
			return fmt.Errorf("the worker died %d times within %v; not restarting it again: %w", len(deaths)+1, cfg.RestartWindow, werr)
		}
		deaths = append(deaths, now)
		restarts++
		if time.Since(started) < cfg.StableAfter {
			backoff = min(max(2*backoff, cfg.MinBackoff), cfg.MaxBackoff)
		} else {
			backoff = 0
		}
		names, _ := k.Held()
		log.Warn("the worker died; starting another, which takes its sockets (new connections wait meanwhile)",
			zap.Int("pid", w.Pid()), zap.Error(werr), zap.Int("socketsKept", len(names)), zap.Duration("after", backoff),
			zap.Int("restarts", restarts), zap.Int("restartsLeft", cfg.MaxRestarts-len(deaths)), zap.Duration("within", cfg.RestartWindow))
		restart = time.After(backoff)
		return nil
	}
	done := ctx.Done()
	for {
		select {
		case <-done:
			done = nil
			stop(syscall.SIGTERM)
			if len(live) == 0 {
				return nil
			}
		case sig := <-cfg.Signals:
			switch sig {
			case syscall.SIGINT, syscall.SIGTERM:
				log.Info("stopping the worker", zap.Stringer("signal", sig))
				stop(sig)
				if len(live) == 0 {
					return nil
				}
			case syscall.SIGHUP:
				if current != nil && live[current] {
					_ = current.Signal(sig)
				}
			case syscall.SIGUSR2:
				switch {
				case stopping:
				case retiring != nil:
					log.Info("SIGUSR2: a new worker is starting already; it is the restart asked for")
				case ready():
					replace()
				default:
					// Not served yet (just started, a crashed worker's
					// replacement under way, or made current again after
					// its successor failed): done once it has.
					owed = true
					log.Info("SIGUSR2: the running worker has not served yet; a new one starts once it has")
				}
			}
		case <-k.Deposits():
			// Once the successor serves, its predecessor has handed over
			// and drains; with a successor wait (--successor-wait, as in
			// the DaemonSet) it then waits to be told to terminate, and
			// no kubelet will tell a worker: the master does.
			if retiring != nil && served(current) {
				if live[retiring] {
					log.Info("the new worker serves; telling the one it replaced to finish", zap.Int("pid", retiring.Pid()))
					_ = retiring.Signal(syscall.SIGTERM)
				}
				retiring = nil
			}
			if owed && ready() {
				replace()
			}
		case <-restart:
			restart = nil
			if stopping {
				return nil
			}
			if err := start(); err != nil {
				return err
			}
		case <-reap.C:
			reapNow()
		case e := <-exits:
			delete(live, e.w)
			reapNow()
			wasServed := served(e.w)
			everServed = everServed || wasServed
			k.Forget(e.w.Pid())
			if e.w != current {
				log.Info("the previous worker exited", zap.Int("pid", e.w.Pid()), zap.Error(e.err))
				if stopping && len(live) == 0 {
					return nil
				}
				continue
			}
			switch {
			case stopping:
				if len(live) == 0 {
					return e.err
				}
				continue
			case e.err == nil:
				log.Info("the worker exited by itself; so does the master", zap.Int("pid", e.w.Pid()))
				stop(syscall.SIGTERM)
				if len(live) == 0 {
					return nil
				}
				continue
			}
			if !wasServed {
				if prev := retiring; prev != nil && live[prev] && stillServes(cfg.Handover) {
					// A SIGUSR2 successor that failed before it took over:
					// the worker it was to replace still serves.
					log.Error("the new worker failed before it served; the running one stays", zap.Int("pid", e.w.Pid()), zap.Error(e.err))
					current, retiring, started = prev, nil, time.Time{}
					// It may still be finishing a handover the dead one
					// asked for: watch that it keeps answering.
					fellBack, fellBackUntil = prev, time.Now().Add(fallBackWatch)
					fallBackTick.Reset(time.Second)
					continue
				}
				// Otherwise it failed after the old one handed over to it
				// (which then drains, and is told to finish once a
				// replacement serves): one more death, below.
				if !everServed && retiring == nil {
					stop(syscall.SIGTERM)
					return fmt.Errorf("the worker failed before it served: %w", e.err)
				}
				// A replacement that died before serving is one more death
				// of a crash loop (counted below), not a bad configuration:
				// the same one served before.
			}
			if err := died(e.w, e.err); err != nil {
				return err
			}
		case <-fallBackTick.C:
			switch {
			case fellBack == nil || fellBack != current || !live[fellBack] || time.Now().After(fellBackUntil):
				fellBack = nil
				fallBackTick.Stop()
				if owed && ready() {
					replace()
				}
			case !stillServes(cfg.Handover):
				// It handed over to the successor that died: it drains
				// and serves no more.
				w := fellBack
				fellBack = nil
				fallBackTick.Stop()
				retiring = w
				if err := died(w, errHandedOverToDead); err != nil {
					return err
				}
			}
		}
	}
}

// stillServes reports whether a worker answers at the handover socket
// path: one that has handed over stops listening there.
func stillServes(path string) bool {
	if path == "" {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ok, err := handover.Answers(ctx, path)
	return ok || err != nil // unsure: keep the one that may serve
}
