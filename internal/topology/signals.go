package topology

import (
	"errors"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// live holds the topologies not yet closed, for the signal handler and for
// tests' leak checks.
var live struct {
	sync.Mutex
	topos   map[*Topology]struct{}
	handler sync.Once
}

func register(t *Topology) {
	live.Lock()
	if live.topos == nil {
		live.topos = make(map[*Topology]struct{})
	}
	live.topos[t] = struct{}{}
	live.Unlock()
	if t.signals {
		live.handler.Do(handleSignals)
	}
}

func unregister(t *Topology) {
	live.Lock()
	delete(live.topos, t)
	live.Unlock()
}

// closeAll closes every live topology; with onlySignals, only those that
// asked for the signal handler.
func closeAll(onlySignals bool) error {
	live.Lock()
	var ts []*Topology
	for t := range live.topos {
		if t.signals || !onlySignals {
			ts = append(ts, t)
		}
	}
	live.Unlock()
	var errs []error
	for _, t := range ts {
		if err := t.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// handleSignals installs, once per process, a handler for SIGINT, SIGTERM and
// SIGHUP (each unless the process ignores it) that closes the topologies made
// without Options.NoSignalCleanup, then restores the default action and
// re-sends the signal, so the process ends as it would have.
func handleSignals() {
	var sigs []os.Signal
	for _, s := range []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP} {
		if !signal.Ignored(s) {
			sigs = append(sigs, s)
		}
	}
	if len(sigs) == 0 {
		return
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	go func() {
		sig := <-ch
		_ = closeAll(true) // best effort: the process is going away
		signal.Reset(sigs...)
		if p, err := os.FindProcess(os.Getpid()); err == nil {
			_ = p.Signal(sig)
		}
	}()
}
