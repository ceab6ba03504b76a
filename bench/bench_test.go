package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/internal/topology"
)

// needBench skips unless this machine can run the suite: root, ip,
// iptables and ipset.
func needBench(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping the benchmark suite in -short mode")
	}
	if err := preflight(); err != nil {
		t.Skipf("skipping: %v", err)
	}
}

// TestPrivilegedSuiteQuick runs the suite in its quickest form — one short
// round of direct and svcproxy-userspace, every test, a small control
// plane — and checks only that it produced results, never how fast.
func TestPrivilegedSuiteQuick(t *testing.T) {
	needBench(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out := t.TempDir()
	res, err := Run(ctx, Config{
		Preset:        "test",
		Modes:         []string{"direct", "svcproxy-userspace"},
		Rounds:        1,
		Duration:      time.Second,
		FaultDuration: 2 * time.Second,
		Scales:        []int{50},
		Endpoints:     10,
		Changes:       3,
		IdleConns:     300,
		Tests:         allTests,
		Out:           out,
		Loadgen:       "auto",
		Syscalls:      true,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, f := range []string{"results.md", "results.json", "throughput.svg", "requests.svg", "latency.svg", "connrate.svg", "sync.svg"} {
		if _, err := os.Stat(filepath.Join(res.Dir, f)); err != nil {
			t.Errorf("no %s: %v", f, err)
		}
	}
	for _, m := range []string{"direct", "svcproxy-userspace"} {
		for _, tm := range [][2]string{{testBulk1, "gbps"}, {testKeepAlive, "rps"}, {testConnRate, "conn_per_s"}, {testMiB, "per_s"}} {
			if len(res.values(m, tm[0], tm[1])) == 0 {
				t.Errorf("%s: no %s %s sample", m, tm[0], tm[1])
			}
		}
	}
	for _, tm := range [][2]string{{testIdle, "rss_mib"}, {testFault, "failed"}, {testKeepAlive, "cpu_us_per_req"}} {
		if len(res.values("svcproxy-userspace", tm[0], tm[1])) == 0 {
			t.Errorf("svcproxy-userspace: no %s %s sample", tm[0], tm[1])
		}
	}
	if len(res.ControlPlane) != 1 || res.ControlPlane[0].Error != "" || len(res.ControlPlane[0].ChangesMs) != 3 {
		t.Errorf("control plane: got %+v, want one measurement with 3 changes", res.ControlPlane)
	}
	data, err := os.ReadFile(filepath.Join(res.Dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back Results
	if err := json.Unmarshal(data, &back); err != nil || len(back.Samples) != len(res.Samples) {
		t.Errorf("results.json: %v, %d samples, want %d", err, len(back.Samples), len(res.Samples))
	}
	md, _ := os.ReadFile(filepath.Join(res.Dir, "results.md"))
	if !strings.Contains(string(md), "| **svcproxy-userspace** |") {
		t.Errorf("results.md has no svcproxy-userspace row:\n%s", md)
	}
	// This process's namespaces only: another bench may be running.
	if left, _ := filepath.Glob(fmt.Sprintf("/var/run/netns/%s%d-*", namespacePrefix, os.Getpid())); len(left) > 0 {
		t.Errorf("namespaces left behind: %v", left)
	}
}

// TestPrivilegedBuiltinGenerators keeps the fallback load generators
// working where wrk and iperf3 are installed.
func TestPrivilegedBuiltinGenerators(t *testing.T) {
	needBench(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := Run(ctx, Config{
		Preset: "test", Modes: []string{"direct"}, Rounds: 1, Duration: time.Second,
		Tests: []string{testBulk1, testKeepAlive, testConnRate}, Loadgen: "builtin",
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, tm := range [][2]string{{testBulk1, "gbps"}, {testKeepAlive, "p99_ms"}, {testConnRate, "conn_per_s"}} {
		v := res.values("direct", tm[0], tm[1])
		if len(v) != 1 || v[0] <= 0 {
			t.Errorf("%s %s: got %v, want one positive sample", tm[0], tm[1], v)
		}
	}
	for _, s := range res.Samples {
		if s.Tool == toolWrk || s.Tool == toolIperf {
			t.Errorf("sample %+v came from %s with --loadgen=builtin", s, s.Tool)
		}
	}
}

// TestPrivilegedKubeRulesRestore loads the generated kube-proxy-shaped
// rules, then a partial sync, with iptables-legacy-restore in a throwaway
// namespace, and checks the result with iptables-legacy-save.
func TestPrivilegedKubeRulesRestore(t *testing.T) {
	needBench(t)
	if _, err := exec.LookPath("iptables-legacy-restore"); err != nil {
		t.Skip("skipping: iptables-legacy-restore is not installed")
	}
	e := &Env{Scratch: t.TempDir(), Prog: newProgress(nil)}
	e.Tools.IPTablesLegacyRestore, _ = exec.LookPath("iptables-legacy-restore")
	c, err := nodeOnly(e, "rules")
	if errors.Is(err, topology.ErrUnsupported) {
		t.Skipf("skipping: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	services := genServices(20, 3)
	changes := append(genChanges(services, 5), genAdds(services, 2)...)
	res, err := (&kubeDNATMode{}).ProgramServices(context.Background(), e, c, services, changes)
	if err != nil {
		t.Fatalf("ProgramServices: %v", err)
	}
	if len(res.Changes) != 5 || len(res.Adds) != 2 {
		t.Errorf("got %d change and %d add timings, want 5 and 2", len(res.Changes), len(res.Adds))
	}
	out, err := c.Topo.Node.Command(context.Background(), "iptables-legacy-save", "-t", "nat").Output()
	if err != nil {
		t.Fatal(err)
	}
	save := string(out)
	if n := strings.Count(save, "-j DNAT"); n != 66 {
		t.Errorf("got %d DNAT rules after the changes, want 66 (20 services and 2 added, × 3)", n)
	}
	for _, ch := range changes {
		if ch.Added != nil {
			if !strings.Contains(save, "--to-destination "+ch.Added.Endpoints[0].String()) {
				t.Errorf("added Service %s's endpoint is no DNAT target", ch.Added.Service)
			}
			continue
		}
		if strings.Contains(save, "--to-destination "+ch.Old.String()+"\n") && !stillUsed(services, ch.Old) {
			t.Errorf("replaced endpoint %s is still a DNAT target", ch.Old)
		}
		if !strings.Contains(save, "--to-destination "+ch.New.String()) {
			t.Errorf("new endpoint %s is no DNAT target", ch.New)
		}
	}
}

func stillUsed(services []SvcPort, a netip.AddrPort) bool {
	for _, s := range services {
		for _, ep := range s.Endpoints {
			if ep == a {
				return true
			}
		}
	}
	return false
}
