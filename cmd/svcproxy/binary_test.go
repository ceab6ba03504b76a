package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

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
