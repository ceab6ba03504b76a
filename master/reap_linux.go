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
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var reaped []int
	for _, p := range stats {
		pid, ppid, state, ok := procStat(p)
		if !ok || ppid != self || state != "Z" || keep[pid] {
			continue
		}
		var ws unix.WaitStatus
		if got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err == nil && got == pid {
			reaped = append(reaped, pid)
		}
	}
	return reaped
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
