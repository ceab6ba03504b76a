package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/master"
)

// keeperFromMaster is the keeper socket of this process's master, set in
// a worker's environment; "" when it runs alone.
func keeperFromMaster() string { return os.Getenv(master.EnvKeeper) }

// registerWorkerRestarts exports, in a worker, how many workers that died
// its master has replaced (a crash its master hides from kubelet shows
// here).
func registerWorkerRestarts(reg prometheus.Registerer, log *zap.Logger) {
	n, err := strconv.Atoi(os.Getenv(master.EnvRestarts))
	if err != nil || n < 0 {
		log.Warn("the master passed no restart count", zap.String(master.EnvRestarts, os.Getenv(master.EnvRestarts)))
		n = 0
	}
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "svcproxy", Name: "master_worker_restarts_total",
		Help: "Workers that died and that the master (--master-worker) replaced since the master started, counted when this worker started.",
	}, func() float64 { return float64(n) }))
}

// runMaster runs this process as the master of --master-worker: it starts
// this binary again with the same arguments as its worker.
func runMaster(o *options, log *zap.Logger) error {
	if o.handoverSocket == "" {
		return fmt.Errorf("--master-worker needs --handover-socket (the worker hands over through it)")
	}
	keeper, err := master.KeeperPath(o.handoverSocket)
	if err != nil {
		return fmt.Errorf("--master-worker: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(keeper), 0o700); err != nil {
		return fmt.Errorf("--master-worker: %w", err)
	}
	if gone, err := master.RemoveStaleKeepers(context.Background(), o.handoverSocket); err != nil {
		log.Warn("--master-worker: removing stale keeper sockets", zap.Error(err))
	} else if len(gone) > 0 {
		log.Info("--master-worker: removed keeper sockets of masters no longer running", zap.Strings("paths", gone))
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("--master-worker: finding this binary: %w", err)
	}
	// Signals are the master's before its pid is published: a SIGUSR2
	// (upgrade) sent as soon as the pid file appears would otherwise kill it.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR2)
	defer signal.Stop(sigs)
	if o.pidFile != "" {
		if err := os.WriteFile(o.pidFile, []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o644); err != nil {
			return fmt.Errorf("--pid-file: %w", err)
		}
	}
	log = log.Named("master")
	log.Info("master-worker: this process keeps the sockets; a worker serves", zap.String("keeper", keeper))
	return master.Run(context.Background(), master.Config{
		Keeper:   keeper,
		Handover: o.handoverSocket,
		Signals:  sigs,
		Logger:   log,
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
