package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPrivilegedCleanupWhileRunning: --cleanup beside a running svcproxy is
// refused, naming what showed it running, and leaves every rule; --force
// removes them.
func TestPrivilegedCleanupWhileRunning(t *testing.T) {
	c := newCluster(t, 1, "")
	sock := filepath.Join(c.dir, "handover.sock")
	if !waitFor(10*time.Second, func() bool { _, err := os.Stat(sock); return err == nil }) {
		t.Fatalf("svcproxy does not listen on its handover socket %s", sock)
	}
	running := c.nodeRules()
	cleanup := func(args ...string) (string, int) {
		t.Helper()
		out, err := c.topo.Node.Command(context.Background(), bins.svcproxy, append([]string{"--cleanup"}, args...)...).CombinedOutput()
		var exit *exec.ExitError
		switch {
		case errors.As(err, &exit):
			return string(out), exit.ExitCode()
		case err != nil:
			t.Fatal(err)
		}
		return string(out), 0
	}
	for _, tt := range []struct {
		name string
		args []string
		says string
	}{
		{"its handover socket answers", []string{"--handover-socket", sock}, "its handover socket " + sock + " answers a connect"},
		{"its PID file names it", []string{"--handover-socket=", "--pid-file", c.pidFile()}, "--pid-file " + c.pidFile() + " names process"},
	} {
		out, code := cleanup(tt.args...)
		if code != 1 || !strings.Contains(out, "--cleanup refused") || !strings.Contains(out, tt.says) {
			t.Errorf("%s: --cleanup exited %d saying:\n%s\nwant 1, refused, saying %q", tt.name, code, out, tt.says)
		}
		if got := c.nodeRules(); got != running {
			t.Fatalf("%s: a refused --cleanup changed the rules:\nbefore:\n%s\nafter:\n%s", tt.name, running, got)
		}
	}
	if _, err := c.get(c.topo.Clients[0], webVIP+":80"); err != nil {
		t.Errorf("after the refused --cleanup: %v", err)
	}
	// --force removes them anyway, but the running svcproxy hears of its
	// chains changing (nf_tables notifications) and writes everything
	// back at once: a forced cleanup is for an instance that no longer
	// serves, and a live one repairs it. (The forced run may also fail to
	// destroy a set the live one has already put back in use; either
	// way, it warns.)
	if out, _ := cleanup("--handover-socket", sock, "--force"); !strings.Contains(out, "removing the rules of a running svcproxy") {
		t.Errorf("--cleanup --force did not warn that svcproxy runs; it said:\n%s", out)
	}
	if !waitFor(5*time.Second, func() bool { return c.nodeRules() == running }) {
		t.Errorf("the running svcproxy did not repair what --cleanup --force removed within 5s:\nwant:\n%s\ngot:\n%s", running, c.nodeRules())
	}
	if _, err := c.get(c.topo.Clients[0], webVIP+":80"); err != nil {
		t.Errorf("after the forced --cleanup and the repair: %v", err)
	}
	c.stopProxy()
	if got := c.nodeRules(); got != c.saved {
		t.Errorf("rules after svcproxy exits differ from before it:\nbefore:\n%s\nafter:\n%s", c.saved, got)
	}
}
