package main

import (
	"context"
	"errors"
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
	handedOver chan struct{} // closed when a successor has taken over
}

// takeOver takes the sockets of a running svcproxy at path, if one answers.
func takeOver(ctx context.Context, path string, log *zap.Logger) (*succession, map[string]*os.File) {
	s := &succession{path: path, log: log, handedOver: make(chan struct{})}
	if path == "" {
		return s, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		log.Warn("cannot create the handover directory; restarts will not be seamless", zap.Error(err))
		return s, nil
	}
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	h, err := handover.Take(tctx, path)
	switch {
	case errors.Is(err, handover.ErrNoPredecessor):
		return s, nil
	case err != nil:
		log.Warn("could not take over from the running svcproxy; binding anew", zap.Error(err))
		return s, nil
	}
	log.Info("taking over the sockets of the running svcproxy", zap.Int("sockets", len(h.Files)))
	s.from = h
	return s, h.Files
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
	signal.Notify(sig, syscall.SIGUSR2)
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
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // outlives this process
			if err := cmd.Start(); err != nil {
				log.Error("starting successor", zap.String("binary", exe), zap.Error(err))
				continue
			}
			log.Info("started successor", zap.String("binary", exe), zap.Int("pid", cmd.Process.Pid))
			go func() { _ = cmd.Wait() }()
		}
	}()
}
