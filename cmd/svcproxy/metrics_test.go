package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// scraper reads a running svcproxy's metrics and health addresses.
type scraper struct {
	t       *testing.T
	metrics string // http://address of the metrics server
	healthz string
}

// scrape returns every sample of /metrics, keyed by name{labels} as the
// text format prints them.
func (d *scraper) scrape() map[string]float64 {
	d.t.Helper()
	body, _ := d.get(d.metrics + "/metrics")
	out := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			d.t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

func (d *scraper) get(url string) (string, *http.Response) {
	d.t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		d.t.Fatal(err)
	}
	return string(body), resp
}

// waitMetric scrapes until cond holds for the sample key.
func (d *scraper) waitMetric(key string, cond func(float64) bool) map[string]float64 {
	d.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := d.scrape()
		if v, ok := s[key]; ok && cond(v) {
			return s
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("timed out waiting on %s (now %v, present %v)", key, s[key], func() bool { _, ok := s[key]; return ok }())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

const (
	syncCount     = `kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}`
	fullCount     = `kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"}`
	partialCount  = `kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"}`
	lastSync      = `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`
	lastQueued    = `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"}`
	programming   = `kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"}`
	programSum    = `kubeproxy_network_programming_duration_seconds_sum{ip_family="IPv4"}`
	epPending     = `kubeproxy_sync_proxy_rules_endpoint_changes_pending`
	epTotal       = `kubeproxy_sync_proxy_rules_endpoint_changes_total`
	svcPending    = `kubeproxy_sync_proxy_rules_service_changes_pending`
	svcTotal      = `kubeproxy_sync_proxy_rules_service_changes_total`
	noLocalInt    = `kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"}`
	noLocalExt    = `kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"}`
	healthz200    = `kubeproxy_proxy_healthz_total{code="200"}`
	livez200      = `kubeproxy_proxy_livez_total{code="200"}`
	ownLastSync   = `svcproxy_sync_proxy_rules_last_timestamp_seconds`
	ownSyncCount  = `svcproxy_sync_proxy_rules_duration_seconds_count`
	ownFailures   = `svcproxy_sync_proxy_rules_failures_total{type="partial"}`
	ownFullFails  = `svcproxy_sync_proxy_rules_failures_total{type="full"}`
	ownProgrammed = `svcproxy_network_programming_duration_seconds_count`

	reloadsOK      = `svcproxy_config_reloads_total{result="success"}`
	reloadsFailed  = `svcproxy_config_reloads_total{result="failure"}`
	lastReloadOK   = `svcproxy_config_last_reload_successful`
	lastReloadTime = `svcproxy_config_last_reload_success_timestamp_seconds`
	servicePorts   = `svcproxy_source_service_ports`
)

// freePort returns a loopback port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestBinaryServesKubeProxyEndpoints runs the real svcproxy binary on a
// services file (userspace mode, frontends on loopback: no root, no rules)
// and scrapes it: /proxyMode, kube-proxy's metric names beside svcproxy's,
// a reload counted as a sync that moves the last-sync timestamp, and every
// /healthz answer counted.
func TestBinaryServesKubeProxyEndpoints(t *testing.T) {
	bin := buildSvcproxy(t)
	dir := t.TempDir()
	svcPort, metricsPort, healthzPort := freePort(t), freePort(t), freePort(t)
	services := filepath.Join(dir, "services.yaml")
	writeServices := func(ports ...int) {
		var b strings.Builder
		b.WriteString("services:\n  - name: web\n    clusterIPs: [127.0.0.1]\n    ports:\n")
		for _, p := range ports {
			fmt.Fprintf(&b, "      - port: %d\n        name: p%d\n", p, p)
		}
		b.WriteString("    endpoints:\n      - ip: 127.0.0.1\n")
		if err := os.WriteFile(services, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeServices(svcPort)
	cmd := exec.Command(bin, "--services", services, "--handover-socket=", "--mark=0",
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", metricsPort),
		"--healthz-bind-address", fmt.Sprintf("127.0.0.1:%d", healthzPort))
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("svcproxy did not exit within 15s of SIGTERM")
		}
		if t.Failed() {
			t.Logf("svcproxy output:\n%s", out.String())
		}
	})
	d := &scraper{t: t, metrics: fmt.Sprintf("http://127.0.0.1:%d", metricsPort), healthz: fmt.Sprintf("http://127.0.0.1:%d", healthzPort)}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if resp, err := http.Get(d.metrics + "/proxyMode"); err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("svcproxy's metrics address did not answer within 30s; output:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if body, resp := d.get(d.metrics + "/proxyMode"); body != "userspace" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Errorf("/proxyMode = %q (%s), want userspace as text/plain", body, resp.Header.Get("Content-Type"))
	}
	s := d.waitMetric(lastSync, func(v float64) bool { return v > 0 })
	for _, key := range []string{syncCount, fullCount, partialCount, lastQueued, programming, epPending, epTotal,
		svcPending, svcTotal, noLocalInt, noLocalExt, healthz200, livez200, ownLastSync, ownSyncCount, ownFailures, ownProgrammed,
		`svcproxy_proxy_mode{mode="userspace",requested="userspace"}`} {
		if _, ok := s[key]; !ok {
			t.Errorf("%s missing from /metrics", key)
		}
	}

	// A reload is a sync: counted, and the last-sync timestamp moves.
	writeServices(svcPort, freePort(t))
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	after := d.waitMetric(syncCount, func(v float64) bool { return v > s[syncCount] })
	after = d.waitMetric(lastSync, func(v float64) bool { return v > s[lastSync] })
	if after[ownLastSync] <= s[ownLastSync] || after[ownFailures] != 0 {
		t.Errorf("after a reload: svcproxy last sync %v → %v, failures %v", s[ownLastSync], after[ownLastSync], after[ownFailures])
	}

	if after[reloadsOK] < 2 || after[reloadsFailed] != 0 || after[lastReloadOK] != 1 || after[lastReloadTime] <= 0 {
		t.Errorf("after two good loads: reloads %v ok, %v failed; last successful %v at %v",
			after[reloadsOK], after[reloadsFailed], after[lastReloadOK], after[lastReloadTime])
	}

	// A file with a problem applies nothing: the failure is counted and the
	// Service ports stay.
	if err := os.WriteFile(services, []byte("services:\n  - name: web\n    clusterIPs: [127.0.0.1]\n    ports: [{port: 0}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	failed := d.waitMetric(reloadsFailed, func(v float64) bool { return v >= 1 })
	if failed[lastReloadOK] != 0 || failed[servicePorts] != 2 || failed[lastReloadTime] != after[lastReloadTime] {
		t.Errorf("after a bad file: last successful %v, service ports %v (want 0, 2), last success time %v → %v",
			failed[lastReloadOK], failed[servicePorts], after[lastReloadTime], failed[lastReloadTime])
	}
	writeServices(svcPort)
	after = d.waitMetric(lastReloadOK, func(v float64) bool { return v == 1 })
	if after[servicePorts] != 1 {
		t.Errorf("after fixing the file: %v service ports, want 1", after[servicePorts])
	}

	h0 := after[healthz200]
	for i := 0; i < 2; i++ {
		if body, resp := d.get(d.healthz + "/healthz"); resp.StatusCode != 200 || !strings.Contains(body, `"nodeEligible":true`) {
			t.Fatalf("/healthz = %d %s", resp.StatusCode, body)
		}
	}
	if got := d.scrape()[healthz200]; got != h0+2 {
		t.Errorf("kubeproxy_proxy_healthz_total{code=\"200\"} %v → %v, want +2", h0, got)
	}
}

var built struct {
	once     sync.Once
	dir, bin string
	err      error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// buildSvcproxy builds the svcproxy binary (without the race detector) once
// for the tests that run it, and returns its path.
func buildSvcproxy(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("skipping: no go tool to build svcproxy")
	}
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "svcproxy-bin-"); built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "svcproxy")
		if out, err := exec.Command("go", "build", "-o", built.bin, ".").CombinedOutput(); err != nil {
			built.err = fmt.Errorf("building svcproxy: %v\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}

// syncBuffer is a bytes buffer safe for a process's two output pipes.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
