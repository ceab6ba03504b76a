//go:build !linux

package main

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// keeperFromMaster: there is no master-worker mode here.
func keeperFromMaster() string { return "" }

// registerWorkerRestarts: no worker runs under a master here.
func registerWorkerRestarts(prometheus.Registerer, *zap.Logger) {}

// runMaster fails: master-worker mode passes sockets over unix sockets
// (SCM_RIGHTS), Linux-only like the handover it builds on.
func runMaster(*options, *zap.Logger) error {
	return fmt.Errorf("--master-worker: %w on %s", errors.ErrUnsupported, runtime.GOOS)
}
