package proctest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// GoTool is the go command to build with: $GO, else $GOROOT/bin/go when
// it exists, else "go" from PATH.
func GoTool() string {
	if g := os.Getenv("GO"); g != "" {
		return g
	}
	if root := os.Getenv("GOROOT"); root != "" {
		if p := filepath.Join(root, "bin", "go"); exists(p) {
			return p
		}
	}
	return "go"
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// Build runs `go build [-race] -o out pkg` in dir (empty: the current
// directory), outside any workspace (GOWORK=off).
func Build(dir, out, pkg string, race bool) error {
	args := []string{"build", "-o", out, pkg}
	if race {
		args = []string{"build", "-race", "-o", out, pkg}
	}
	cmd := exec.Command(GoTool(), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %v\n%s", pkg, err, out)
	}
	return nil
}

// NeedTools skips tb unless every named program is installed.
func NeedTools(tb testing.TB, tools ...string) {
	tb.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			tb.Skipf("skipping: %s is not installed (.ci/run installs it)", tool)
		}
	}
}
