package proctest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// StopGrace is how long a process has to exit after SIGINT when its test
// ends.
const StopGrace = 15 * time.Second

// Process is a started program whose output goes to Out.
type Process struct {
	Name string
	Cmd  *exec.Cmd
	Out  *Output

	done chan struct{}
	err  error // Cmd.Wait's, once done is closed
}

// Start starts cmd with its stdout and stderr in a new Output. When tb
// ends, a process still running gets SIGINT and StopGrace to exit (an
// error on tb otherwise), and tb's log gets the output if tb failed.
func Start(tb testing.TB, name string, cmd *exec.Cmd) *Process {
	tb.Helper()
	p := &Process{Name: name, Cmd: cmd, Out: &Output{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.Out, p.Out
	if err := cmd.Start(); err != nil {
		tb.Fatalf("starting %s: %v", name, err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	tb.Cleanup(func() {
		if !p.Exited() {
			_ = cmd.Process.Signal(os.Interrupt)
			if err := p.Wait(StopGrace); err != nil {
				tb.Errorf("%s at the end: %v", name, err)
			}
		}
		if tb.Failed() {
			tb.Logf("%s output:\n%s", name, p.Out)
		}
	})
	return p
}

// Signal sends sig, failing tb if it cannot.
func (p *Process) Signal(tb testing.TB, sig syscall.Signal) {
	tb.Helper()
	if err := p.Cmd.Process.Signal(sig); err != nil {
		tb.Fatalf("signalling %s: %v", p.Name, err)
	}
}

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Alive fails tb, with the output, if the process has exited.
func (p *Process) Alive(tb testing.TB) {
	tb.Helper()
	if p.Exited() {
		tb.Fatalf("%s exited (%v); output:\n%s", p.Name, p.Cmd.ProcessState, p.Out)
	}
}

// Wait waits up to d for the process to exit, and says how it did. One
// still running after d is stopped with Quit and reported.
func (p *Process) Wait(d time.Duration) error {
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("%s exited: %w", p.Name, p.err)
		}
		return nil
	case <-time.After(d):
		Quit(p.Cmd.Process.Pid)
		<-p.done
		return fmt.Errorf("%s still running %v after it was told to stop", p.Name, d)
	}
}

// Quit has a stuck Go process print its goroutines (SIGQUIT), so the test
// log says where it hung, then kills it if it is still there 3s later.
func Quit(pid int) {
	p, err := os.FindProcess(pid)
	if err != nil {
		return
	}
	_ = p.Signal(syscall.SIGQUIT)
	if !WaitGone(pid, 3*time.Second) {
		_ = p.Kill()
	}
}

// WaitGone reports whether process pid ended within d (an exited child
// not yet waited for counts as ended).
func WaitGone(pid int, d time.Duration) bool {
	for deadline := time.Now().Add(d); ; {
		if !Running(pid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Running reports whether process pid exists and is not a zombie (read
// from /proc: false where there is none).
func Running(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}
