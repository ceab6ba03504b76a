//go:build linux

package master

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// reapOrphans waits for this process's zombie children other than the
// workers in keep (whose exits their own Wait collects): processes a
// dead worker left behind, which the kernel hands to PID 1 — the master,
// in a container — and which would otherwise stay zombies. It returns the
// PIDs it reaped.
func reapOrphans(keep map[int]bool) []int {
	self := os.Getpid()
	var reaped []int
	for _, pid := range children() {
		if keep[pid] {
			continue
		}
		_, ppid, state, ok := procStat("/proc/" + strconv.Itoa(pid) + "/stat")
		if !ok || ppid != self || state != "Z" {
			continue
		}
		var ws unix.WaitStatus
		if got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err == nil && got == pid {
			reaped = append(reaped, pid)
		}
	}
	return reaped
}

// children lists this process's children: each thread's
// /proc/self/task/<tid>/children, or, without CONFIG_PROC_CHILDREN, every
// process (the caller checks the parent).
func children() []int {
	var pids []int
	lists, _ := filepath.Glob("/proc/self/task/*/children")
	for _, l := range lists {
		data, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	if len(lists) > 0 {
		return pids
	}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// procStat reads the PID, parent PID and state of /proc/<pid>/stat.
func procStat(path string) (pid, ppid int, state string, ok bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, "", false
	}
	s := string(data)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')') // comm may hold spaces and parentheses
	if open < 0 || end < open {
		return 0, 0, "", false
	}
	f := strings.Fields(s[end+1:])
	if len(f) < 2 {
		return 0, 0, "", false
	}
	pid, err1 := strconv.Atoi(strings.TrimSpace(s[:open]))
	ppid, err2 := strconv.Atoi(f[1])
	return pid, ppid, f[0], err1 == nil && err2 == nil
}
