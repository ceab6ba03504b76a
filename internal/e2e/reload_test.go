package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
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

	// Load: requests to two Services back to back, from four clients.
	var ok, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				addr := webVIP + ":80"
				if i%2 == 1 {
					addr = webExtIP + ":80"
				}
				if _, err := c.get(client, addr); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				} else {
					ok.Add(1)
				}
			}
		}()
	}
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopLoad()

	waitMetric := func(name string, want float64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for c.metric(t, name) < want {
			if time.Now().After(deadline) {
				t.Fatalf("%s stayed under %v for 10s; svcproxy output:\n%s", name, want, c.proxyOut)
			}
			time.Sleep(50 * time.Millisecond)
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

	stopLoad()
	t.Logf("%d requests during the bad reloads, %d failed; reloads: %v ok, %v failed", ok.Load(), failed.Load(),
		c.metric(t, successes), c.metric(t, failures))
	if n := failed.Load(); n != 0 {
		t.Errorf("%d of %d requests failed while bad files were rejected; first: %v", n, n+ok.Load(), firstErr.Load())
	}
	if ok.Load() < 100 {
		t.Errorf("only %d requests succeeded: no real load", ok.Load())
	}
	if got := c.metric(t, "svcproxy_config_last_reload_successful"); got != 1 {
		t.Errorf("svcproxy_config_last_reload_successful = %v after the good file came back, want 1", got)
	}
}
