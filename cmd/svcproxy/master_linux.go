package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/master"
)

// keeperFromMaster is the keeper socket of this process's master, set in
// a worker's environment; "" when it runs alone.
func keeperFromMaster() string { return os.Getenv(master.EnvKeeper) }

// runMaster runs this process as the master of --master-worker: it starts
// this binary again with the same arguments as its worker.
func runMaster(o *options, log *zap.Logger) error {
	if o.handoverSocket == "" {
		return fmt.Errorf("--master-worker needs --handover-socket (the worker hands over through it)")
	}
	keeper := strings.TrimSuffix(o.handoverSocket, ".sock") + "-keeper.sock"
	if err := os.MkdirAll(filepath.Dir(keeper), 0o700); err != nil {
		return fmt.Errorf("--master-worker: %w", err)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("--master-worker: finding this binary: %w", err)
	}
	if o.pidFile != "" {
		if err := os.WriteFile(o.pidFile, []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o644); err != nil {
			return fmt.Errorf("--pid-file: %w", err)
		}
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR2)
	defer signal.Stop(sigs)
	log = log.Named("master")
	log.Info("master-worker: this process keeps the sockets; a worker serves", zap.String("keeper", keeper))
	return master.Run(context.Background(), master.Config{
		Keeper:  keeper,
		Signals: sigs,
		Logger:  log,
		Start: func(env []string) (master.Worker, error) {
			cmd := exec.Command(exe, os.Args[1:]...)
			cmd.Env = append(os.Environ(), env...)
			cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
			if err := cmd.Start(); err != nil {
				return nil, err
			}
			return process{cmd}, nil
		},
	})
}

// process is a worker started with os/exec.
type process struct{ cmd *exec.Cmd }

func (p process) Pid() int                 { return p.cmd.Process.Pid }
func (p process) Wait() error              { return p.cmd.Wait() }
func (p process) Signal(s os.Signal) error { return p.cmd.Process.Signal(s) }
