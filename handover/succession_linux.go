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

// askMaster sends SIGUSR2 to the parent process, the master.
func askMaster() error { return syscall.Kill(os.Getppid(), syscall.SIGUSR2) }

// ignoreRestart ignores SIGUSR2.
func ignoreRestart() { signal.Ignore(syscall.SIGUSR2) }

// detachedProcess puts a successor in its own process group, so it
// outlives this process.
func detachedProcess() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
