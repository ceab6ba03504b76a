//go:build !linux

package handover

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
)

// SocketPath resolves --handover-socket: zero-downtime restarts pass
// sockets with SCM_RIGHTS, which is Linux-only, so auto means off here and
// a path is refused.
func SocketPath(flag string) (string, error) {
	switch flag {
	case "auto", "":
		return "", nil
	}
	return "", fmt.Errorf("handing sockets over to a successor: %w on %s (leave it at auto, or empty)", errors.ErrUnsupported, runtime.GOOS)
}

// notifyRestart fails: there is no SIGUSR2, and no handover to restart with.
func notifyRestart(chan<- os.Signal) error {
	return fmt.Errorf("restarting on SIGUSR2: %w on %s", errors.ErrUnsupported, runtime.GOOS)
}

// askMaster fails: there is no SIGUSR2 (nor a master: it keeps sockets
// with SCM_RIGHTS).
func askMaster() error {
	return fmt.Errorf("asking the master for a new worker: %w on %s", errors.ErrUnsupported, runtime.GOOS)
}

// ignoreRestart: there is no SIGUSR2.
func ignoreRestart() {}

// detachedProcess is never reached (notifyRestart fails first).
func detachedProcess() *syscall.SysProcAttr { return nil }
