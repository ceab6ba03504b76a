package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPrivilegedBadReloadKeepsServing edits the services file under load as
// an operator with a typo does, then as a tool that truncates and rewrites
// it: svcproxy keeps serving every Service as it was (no request fails),
// and counts each rejected load.
func TestPrivilegedBadReloadKeepsServing(t *testing.T) {
	c := newCluster(t, 2, "")
	client := c.topo.Clients[0]
	path := filepath.Join(c.dir, "services.yaml")
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const failures = `svcproxy_config_reloads_total{result="failure"}`
	const successes = `svcproxy_config_reloads_total{result="success"}`

	// Load: requests to two Services, from four clients.
	load := c.startLoad(client, webVIP+":80", webExtIP+":80")

	waitMetric := func(name string, want float64) {
		t.Helper()
		if !waitFor(10*time.Second, func() bool { return c.metric(t, name) >= want }) {
			t.Fatalf("%s stayed under %v for 10s; svcproxy output:\n%s", name, want, c.proxyOut)
		}
	}
	write := func(content []byte) {
		t.Helper()
		if err := os.WriteFile(path, content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	settle := func() { // traffic meanwhile: a dropped Service would fail it
		time.Sleep(1500 * time.Millisecond)
	}

	time.Sleep(500 * time.Millisecond)
	f0, s0 := c.metric(t, failures), c.metric(t, successes)

	// 1. A hot edit with an unknown key in the web Service.
	typo := strings.Replace(string(good), "  - name: web\n", "  - name: web\n    wieght: 2\n", 1)
	if typo == string(good) {
		t.Fatal("the services file has no web Service to edit")
	}
	write([]byte(typo))
	waitMetric(failures, f0+1)
	settle()
	if got := c.metric(t, "svcproxy_config_last_reload_successful"); got != 0 {
		t.Errorf("svcproxy_config_last_reload_successful = %v after a rejected load, want 0", got)
	}
	if !strings.Contains(c.proxyOut.String(), "services[0].wieght: unknown key") {
		t.Errorf("svcproxy did not log the problem with its line; output:\n%s", c.proxyOut)
	}

	// 2. Truncate, then rewrite a moment later (longer than the debounce,
	// so the empty file is read on its own).
	write(good)
	waitMetric(successes, s0+1)
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	waitMetric(failures, f0+2)
	settle()
	write(good)
	waitMetric(successes, s0+2)
	settle()

	load.stop()
	ok, failed := load.ok.Load(), load.failed.Load()
	t.Logf("%d requests during the bad reloads, %d failed; reloads: %v ok, %v failed", ok, failed,
		c.metric(t, successes), c.metric(t, failures))
	if failed != 0 {
		t.Errorf("%d of %d requests failed while bad files were rejected; first: %v", failed, failed+ok, load.firstErr.Load())
	}
	if ok < 100 {
		t.Errorf("only %d requests succeeded: no real load", ok)
	}
	if got := c.metric(t, "svcproxy_config_last_reload_successful"); got != 1 {
		t.Errorf("svcproxy_config_last_reload_successful = %v after the good file came back, want 1", got)
	}
}
