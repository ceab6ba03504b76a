package hygiene

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
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
		mod + "netfilter":            {"k8s.io/client-go", mod + "forwarder", mod + "redirect", mod + "kernelmodes", mod + "source"},
		mod + "kernelmodes/iptables": {"k8s.io/client-go", mod + "forwarder", mod + "redirect", mod + "source"},
		mod + "kernelmodes/ipvs":     {"k8s.io/client-go", mod + "forwarder", mod + "redirect", mod + "source"},
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
