package daemon

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/handover"
	"github.com/svcproxy/svcproxy/proxymode"
)

// owner finds a running svcproxy that owns the rules --cleanup would remove,
// by what such a process leaves: its handover socket answers a connect (a
// stale socket file of a crashed one does not), or the --pid-file names a
// running process of the same program. A svcproxy still starting (before
// its first sync it neither listens on the socket nor writes the PID file)
// is not found.
type owner struct {
	handoverSocket string // --handover-socket; "": not looked at
	pidFile        string // --pid-file; "": not looked at

	answers func(ctx context.Context, path string) (bool, error) // handover.Answers
	proc    string                                               // where the processes are: /proc
	self    int                                                  // this process, never an owner
}

// newOwner looks at the handover socket and the PID file ("": not looked
// at) of this node, in /proc.
func newOwner(handoverSocket, pidFile string) owner {
	return owner{handoverSocket: handoverSocket, pidFile: pidFile, answers: handover.Answers, proc: "/proc", self: os.Getpid()}
}

// find says how it knows a running svcproxy owns the rules, or "" if it
// finds none. The error is what kept it from telling.
func (w owner) find(ctx context.Context) (string, error) {
	var found []string
	if w.handoverSocket != "" {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ok, err := w.answers(ctx, w.handoverSocket)
		cancel()
		if err != nil {
			return "", fmt.Errorf("could not tell whether a svcproxy listens on its handover socket: %w", err)
		}
		if ok {
			found = append(found, fmt.Sprintf("its handover socket %s answers a connect", w.handoverSocket))
		}
	}
	if w.pidFile != "" {
		if pid, name, ok := w.runningFromPIDFile(); ok {
			found = append(found, fmt.Sprintf("--pid-file %s names process %d (%s), which is running", w.pidFile, pid, name))
		}
	}
	return strings.Join(found, "; "), nil
}

// runningFromPIDFile reads the PID file and reports the process it names
// if that is running (not a zombie) and is the same program as this one
// (a stale file's PID may have been reused by another).
func (w owner) runningFromPIDFile() (pid int, name string, ok bool) {
	data, err := os.ReadFile(w.pidFile)
	if err != nil {
		return 0, "", false
	}
	if pid, err = strconv.Atoi(strings.TrimSpace(string(data))); err != nil || pid <= 0 || pid == w.self {
		return 0, "", false
	}
	dir := filepath.Join(w.proc, strconv.Itoa(pid))
	status, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return 0, "", false // no such process
	}
	for _, line := range bytes.Split(status, []byte("\n")) {
		if state, found := bytes.CutPrefix(line, []byte("State:")); found && bytes.HasPrefix(bytes.TrimSpace(state), []byte("Z")) {
			return 0, "", false // exited, not yet reaped
		}
	}
	comm, err := os.ReadFile(filepath.Join(dir, "comm"))
	if err != nil {
		return 0, "", false
	}
	own, err := os.ReadFile(filepath.Join(w.proc, "self", "comm"))
	if err != nil || !bytes.Equal(comm, own) {
		return 0, "", false
	}
	return pid, string(bytes.TrimSpace(comm)), true
}

// guardCleanup refuses --cleanup while a running svcproxy owns the rules,
// saying how it knows, unless --force (then it only warns).
func guardCleanup(ctx context.Context, w owner, force bool, log *zap.Logger) error {
	found, err := w.find(ctx)
	switch {
	case err != nil && !force:
		return fmt.Errorf("--cleanup refused: %w; add --force to clean up anyway", err)
	case found != "" && !force:
		return fmt.Errorf("--cleanup refused: a running svcproxy owns the rules (%s); stop it first, or add --force to remove them from under it", found)
	case found != "":
		log.Warn("--force: removing the rules of a running svcproxy", zap.String("found", found))
	case err != nil:
		log.Warn("--force: cleaning up without knowing whether a svcproxy runs", zap.Error(err))
	}
	return nil
}

// Cleanup is --cleanup: it removes everything svcproxy installs, whichever
// mode of modes installed it, unless a running svcproxy owns it (found by
// its handover socket or PID file) and not force.
func Cleanup(ctx context.Context, modes proxymode.Table, fw Firewall, handoverSocket, pidFile string, force bool, log *zap.Logger) error {
	if err := guardCleanup(ctx, newOwner(handoverSocket, pidFile), force, log); err != nil {
		return err
	}
	if err := modes.Cleanup(ctx, ""); err != nil {
		return err
	}
	if fw != nil {
		if err := fw.Cleanup(ctx); err != nil {
			return fmt.Errorf("removing the loadBalancerSourceRanges firewall: %w", err)
		}
	}
	log.Info("removed every svcproxy rule and set")
	return nil
}
