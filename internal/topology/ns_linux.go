package topology

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// Do runs fn on a goroutine locked to an OS thread that has been switched
// into h's namespace (setns(2)), then switches the thread back. Sockets fn
// creates live in h's namespace and keep working afterwards. Goroutines fn
// starts run on other threads, in the caller's namespace. If switching back
// fails the thread is never unlocked, so it dies with the goroutine instead
// of running other code in the wrong namespace. A panic in fn is re-raised
// on the caller's goroutine.
func (h *Host) Do(fn func() error) error {
	type result struct {
		err      error
		panicked bool
		panicVal any
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("topology: opening this thread's namespace: %w", err)}
			return
		}
		defer unix.Close(orig)
		target, err := unix.Open(netnsPath(h.NS), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("topology: opening namespace %s: %w", h.NS, err)}
			return
		}
		err = unix.Setns(target, unix.CLONE_NEWNET)
		unix.Close(target)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("topology: entering namespace %s: %w", h.NS, err)}
			return
		}
		r := result{panicked: true}
		defer func() {
			if r.panicked {
				r.panicVal = recover()
			}
			if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
				runtime.UnlockOSThread()
			} // else: still locked, so the thread exits with this goroutine.
			done <- r
		}()
		r.err = fn()
		r.panicked = false
	}()
	r := <-done
	if r.panicked {
		if r.panicVal == nil { // fn called runtime.Goexit (t.FailNow, say)
			return fmt.Errorf("topology: fn exited its goroutine inside %s", h.NS)
		}
		panic(r.panicVal)
	}
	return r.err
}

// killProcesses SIGKILLs every process (other than this one) whose network
// namespace is ns: they were started there by this topology's users, and
// would keep the namespace alive, unseen, after `ip netns del`.
func killProcesses(ns string) error {
	var want unix.Stat_t
	if err := unix.Stat(netnsPath(ns), &want); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	self := os.Getpid()
	var errs []error
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		var st unix.Stat_t
		if unix.Stat("/proc/"+e.Name()+"/ns/net", &st) != nil {
			continue // gone, a zombie, or a kernel thread
		}
		if st.Dev != want.Dev || st.Ino != want.Ino {
			continue
		}
		if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("killing pid %d: %w", pid, err))
		}
	}
	return errors.Join(errs...)
}

// pidAlive tells whether a process with this pid exists.
func pidAlive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}
