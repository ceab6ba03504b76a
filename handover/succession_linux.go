package handover

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// SocketPath resolves --handover-socket: auto is a path per network
// namespace, so svcproxys in different namespaces never meet.
func SocketPath(flag string) (string, error) {
	if flag != "auto" {
		return flag, nil
	}
	ns, err := os.Readlink("/proc/self/ns/net") // "net:[4026531840]"
	if err != nil {
		return "", fmt.Errorf("auto: reading the network namespace: %w", err)
	}
	return "/run/svcproxy/handover-" + strings.Trim(strings.TrimPrefix(ns, "net:"), "[]") + ".sock", nil
}

// notifyRestart relays SIGUSR2, which starts a successor, to c.
func notifyRestart(c chan<- os.Signal) error {
	signal.Notify(c, syscall.SIGUSR2)
	return nil
}

// masterPID is the parent this process started under: its master, for a
// worker.
var masterPID = os.Getppid()

// askMaster sends SIGUSR2 to the master, unless it has gone (this process
// was given to another parent, which SIGUSR2 may mean something else to).
func askMaster() error {
	if os.Getppid() != masterPID {
		return fmt.Errorf("the master (PID %d) has gone", masterPID)
	}
	return syscall.Kill(masterPID, syscall.SIGUSR2)
}

// ignoreRestart ignores SIGUSR2.
func ignoreRestart() { signal.Ignore(syscall.SIGUSR2) }

// detachedProcess puts a successor in its own process group, so it
// outlives this process.
func detachedProcess() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
