package hygiene

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type pkg struct {
	ImportPath string
	Doc        string
	Deps       []string
	Imports    []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps=false", "-json", "github.com/svcproxy/svcproxy/...").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 5 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	return pkgs
}

// TestImportBoundaries keeps lb pure and each mode to its own kernel
// boundary: a package may not depend, even indirectly, on what it must not
// know about.
func TestImportBoundaries(t *testing.T) {
	const mod = "github.com/svcproxy/svcproxy/"
	forbidden := map[string][]string{
		mod + "lb": {"k8s.io/client-go", "k8s.io/api", "golang.org/x/sys/unix", "github.com/coreos/go-iptables",
			"github.com/moby/ipvs", "github.com/vishvananda/netlink", "net/http", mod + "forwarder", mod + "redirect", mod + "kernelmodes"},
		mod + "forwarder":            {"k8s.io/client-go", "k8s.io/api", mod + "redirect", mod + "kernelmodes", mod + "source"},
		mod + "redirect":             {"k8s.io/client-go", "k8s.io/api", mod + "forwarder", mod + "kernelmodes", mod + "source"},
		mod + "connlog":              {mod + "lb", mod + "forwarder"},
		mod + "offload":              {"k8s.io/client-go", mod + "lb", mod + "forwarder", mod + "connlog", mod + "redirect", mod + "kernelmodes", mod + "source"},
		mod + "iface":                {"k8s.io/client-go", "k8s.io/api", mod + "lb", mod + "forwarder", mod + "redirect", mod + "kernelmodes", mod + "source"},
		mod + "userspace":            {mod + "kernelmodes", mod + "source"},
		mod + "netfilter":            {"k8s.io/client-go", mod + "forwarder", mod + "redirect", mod + "kernelmodes", mod + "source"},
		mod + "kernelmodes/iptables": {"k8s.io/client-go", mod + "forwarder", mod + "redirect", mod + "source"},
		mod + "kernelmodes/ipvs":     {"k8s.io/client-go", mod + "forwarder", mod + "redirect", mod + "source"},
		mod + "kernelmodes/nftables": {"k8s.io/client-go", mod + "forwarder", mod + "redirect", mod + "source"},
	}
	for _, p := range listPackages(t) {
		rules, ok := forbidden[p.ImportPath]
		if !ok {
			continue
		}
		for _, dep := range p.Deps {
			for _, bad := range rules {
				if dep == bad || strings.HasPrefix(dep, bad+"/") {
					t.Errorf("%s depends on %s, which it must not", p.ImportPath, dep)
				}
			}
		}
	}
}

// TestEveryPackageHasADocComment: each package says what it owns.
func TestEveryPackageHasADocComment(t *testing.T) {
	for _, p := range listPackages(t) {
		if strings.TrimSpace(p.Doc) == "" {
			t.Errorf("package %s has no doc comment", p.ImportPath)
		}
	}
}

// TestNoCatchAllPackages: one noun per package, no util or common.
func TestNoCatchAllPackages(t *testing.T) {
	for _, p := range listPackages(t) {
		last := p.ImportPath[strings.LastIndex(p.ImportPath, "/")+1:]
		switch last {
		case "util", "utils", "common", "helpers", "misc":
			t.Errorf("package %s: name a package after what it owns", p.ImportPath)
		}
	}
}

// TestGoModTidy: go.mod lists what the code imports, directly imported
// modules without "// indirect", and go.sum what builds need: `go mod tidy
// -diff` reports nothing. It needs the module cache or the module proxy;
// when neither answers it skips, saying so.
func TestGoModTidy(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: go mod tidy may need the module proxy")
	}
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	// The main module, and the end-to-end module in test/, which requires
	// it through a replace: a new requirement of the main module makes
	// test/go.mod untidy, and `make test-kube` fails on it.
	for _, dir := range []string{".", "test"} {
		t.Run(dir, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "go", "mod", "tidy", "-diff")
			cmd.Dir = filepath.Join(strings.TrimSpace(string(root)), dir)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			switch {
			case err == nil:
				return
			case stdout.Len() > 0:
				t.Fatalf("%s/go.mod or go.sum is not tidy; run `go mod tidy` there. go mod tidy -diff:\n%s", dir, stdout.String())
			case ctx.Err() != nil || unreachable(stderr.String()):
				t.Skipf("go mod tidy -diff could not reach the module proxy (%v): %s", err, strings.TrimSpace(stderr.String()))
			default:
				t.Fatalf("go mod tidy -diff in %s: %v\n%s", dir, err, stderr.String())
			}
		})
	}
}

// unreachable reports whether the go command's stderr says it could not
// reach the network, as opposed to finding the module broken.
func unreachable(stderr string) bool {
	for _, s := range []string{"dial tcp", "no such host", "i/o timeout", "connection refused", "network is unreachable",
		"TLS handshake timeout", "GOPROXY=off", "GOFLAGS=-mod=vendor", "proxyconnect"} {
		if strings.Contains(stderr, s) {
			return true
		}
	}
	return false
}
