package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// largeServices returns n Services in the services file's format, each a
// ClusterIP of its own (198.19.16.1 up) with the cluster's backends as
// endpoints: about 175 bytes each, 10 MB for 58,288.
func (c *cluster) largeServices(n int) string {
	var eps strings.Builder
	for _, b := range c.backends {
		fmt.Fprintf(&eps, "      - ip: %s\n", b.host.Addr)
	}
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "  - name: bulk-%d\n    namespace: bulk\n    clusterIP: 198.19.%d.%d\n    ports:\n      - port: 80\n        targetPort: 8080\n    endpoints:\n%s",
			i, 16+i/250, 1+i%250, eps.String())
	}
	return b.String()
}

// TestPrivilegedMemoryAfterShrink loads a 10 MB services file (58,288
// Services, as issue 15 measured) into a running svcproxy, then the small
// file it started with: within 30 s svcproxy returns memory for the shrink
// (svcproxy_memory_returns_total), and its RSS right after the return is
// within twice what it was at start with that small file.
//
// Twice, not less: right after the return the RSS measured 48–54 MiB
// against 34 MiB at a fresh start (8 runs, 2026-11-27): the runtime keeps
// about 12 MiB of span and GC metadata for the large heap, and the next
// sync's garbage grows the heap towards its goal again (65–69 MiB 30 s
// later, with 17 MiB live, which the test does not wait for). A bound of
// 1.5 times failed about one run in six on those few MiB. What it guards
// against is the 580 MiB kept for good before memory was returned.
func TestPrivilegedMemoryAfterShrink(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped in -short mode: it loads 58,288 Services")
	}
	const bulk = 58288
	c := newClusterWith(t, 2, bins.svcproxyNoRace)
	client := c.topo.Clients[0]
	pid := c.proxy.Process.Pid
	path := filepath.Join(c.dir, "services.yaml")
	small, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ports := func() float64 { return c.metric(t, "svcproxy_source_service_ports") }
	smallPorts := ports()
	for i := 0; i < 20; i++ { // warm up, as after any start
		if _, err := c.get(client, webVIP+":80"); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	fresh := c.usage(t, pid)
	t.Logf("fresh start with %v service ports: %v", smallPorts, fresh)

	large := string(small) + c.largeServices(bulk)
	t.Logf("large file: %.1f MB", float64(len(large))/1e6)
	if err := os.WriteFile(path, []byte(large), 0o644); err != nil {
		t.Fatal(err)
	}
	if !waitFor(2*time.Minute, func() bool { return ports() == smallPorts+bulk }) {
		t.Fatal("the large file was not loaded within 2 minutes")
	}
	// Programmed: a Service of the bulk answers.
	last := fmt.Sprintf("198.19.%d.%d:80", 16+(bulk-1)/250, 1+(bulk-1)%250)
	if !waitFor(2*time.Minute, func() bool { _, err := c.get(client, last); return err == nil }) {
		t.Fatalf("%s not served within 2 minutes of loading", last)
	}
	loaded := c.usage(t, pid)
	t.Logf("with %d more Services: %v", bulk, loaded)

	returns := c.metric(t, "svcproxy_memory_returns_total")
	if err := os.WriteFile(path, small, 0o644); err != nil {
		t.Fatal(err)
	}
	shrunk := time.Now()
	if !waitFor(time.Minute, func() bool { return ports() == smallPorts }) {
		t.Fatal("the small file was not loaded again within a minute")
	}
	if _, err := c.get(client, webVIP+":80"); err != nil {
		t.Fatal(err)
	}
	limit := fresh.rssMiB * 2
	var after usage
	var returned float64
	for {
		returned = c.metric(t, "svcproxy_memory_returns_total")
		after = c.usage(t, pid)
		if (returned > returns && after.rssMiB <= limit) || time.Since(shrunk) > 30*time.Second {
			break
		}
		time.Sleep(time.Second)
	}
	t.Logf("%v after shrinking back: %v; memory returns %v → %v", time.Since(shrunk).Round(time.Second), after, returns, returned)
	if returned <= returns {
		t.Errorf("svcproxy_memory_returns_total stayed at %v: no memory returned for the shrink", returned)
	}
	if after.rssMiB > limit {
		t.Errorf("RSS %d MiB 30 s after shrinking from %d MiB, want at most %d (twice the %d MiB of a fresh start)",
			after.rssMiB, loaded.rssMiB, limit, fresh.rssMiB)
	}
}
