package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/internal/proctest"
	"github.com/svcproxy/svcproxy/test/apiserver"
)

// TestPrivilegedKubeTopology runs the main module's binary end-to-end tests
// against a real API server: internal/e2e's TestPrivilegedKube* start the
// real svcproxy binary on the node namespace of a network-namespace
// topology, feed it from the API server named by SVCPROXY_E2E_KUBECONFIG,
// and send traffic from a client namespace. They live in the main module
// because internal/topology cannot be imported from here; this test
// provides the API server (its Service range is the topology's VIP range)
// and runs them with `go test`.
func TestPrivilegedKubeTopology(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: network-namespace topologies need root")
	}
	bins, err := buildBinaries(t)
	if err != nil {
		t.Skipf("skipping: kube-apiserver and etcd cannot be built here: %v", err)
	}
	srv, err := apiserver.Start(context.Background(), bins, apiserver.Options{ServiceCIDR: "198.19.0.0/16", Logf: t.Logf})
	if err != nil {
		t.Fatalf("starting the API server: %v", err)
	}
	defer srv.Stop()
	mainModule, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, proctest.GoTool(), "test", "-race", "-count=1", "-v", "-run", "^TestPrivilegedKube", "./internal/e2e")
	cmd.Dir = mainModule
	cmd.Env = append(os.Environ(), "SVCPROXY_E2E_KUBECONFIG="+srv.Kubeconfig, "GOWORK=off")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err = cmd.Run()
	t.Logf("go test ./internal/e2e (%v):\n%s", time.Since(start).Round(time.Second), out.String())
	if err != nil {
		t.Fatalf("the binary end-to-end tests failed: %v", err)
	}
	switch s := out.String(); {
	case strings.Contains(s, "no --kubeconfig flag yet"):
		t.Skip("skipping: svcproxy has no --kubeconfig flag yet; internal/e2e's TestPrivilegedKubeBinary skipped (see its output above)")
	case !strings.Contains(s, "--- PASS: TestPrivilegedKubeBinary"):
		t.Fatal("TestPrivilegedKubeBinary did not pass (skipped?); see the output above")
	}
}
