//go:build linux

package master

import (
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestReapOrphans: a process orphaned onto this one (made a subreaper, as
// PID 1 is) is reaped once it exits; a zombie child in keep is left for
// its own Wait.
func TestReapOrphans(t *testing.T) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Skipf("cannot become a subreaper: %v", err)
	}
	defer unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)

	// sh starts sleep in the background and exits: sleep is orphaned
	// onto this process.
	out, err := exec.Command("sh", "-c", "sleep 0.2 & echo $!").Output()
	if err != nil {
		t.Fatal(err)
	}
	orphan, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("sh printed %q", out)
	}
	kept := exec.Command("true")
	if err := kept.Start(); err != nil {
		t.Fatal(err)
	}

	var reaped []int
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Contains(reaped, orphan) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		reaped = append(reaped, reapOrphans(map[int]bool{kept.Process.Pid: true})...)
	}
	if !slices.Contains(reaped, orphan) {
		t.Errorf("reaped %v, want the orphan %d", reaped, orphan)
	}
	if slices.Contains(reaped, kept.Process.Pid) {
		t.Errorf("reaped the kept child %d", kept.Process.Pid)
	}
	if err := kept.Wait(); err != nil {
		t.Errorf("the kept child's own Wait: %v, want its exit status", err)
	}
	if _, _, state, ok := procStat("/proc/" + strconv.Itoa(orphan) + "/stat"); ok {
		t.Errorf("the orphan is still there, state %s", state)
	}
}
