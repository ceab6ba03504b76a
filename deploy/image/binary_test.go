package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// git runs git in dir with a fixed identity and dates, failing the test on
// error.
func git(t *testing.T, dir string, args ...string) {
	t.Helper()
	env := []string{"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com",
		"GIT_AUTHOR_DATE=2026-01-02T03:04:05Z", "GIT_COMMITTER_DATE=2026-01-02T03:04:05Z", "GIT_CONFIG_GLOBAL=/dev/null"}
	if _, err := runCommand(context.Background(), dir, env, "git", args...); err != nil {
		t.Fatal(err)
	}
}

func TestGitCommit(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skipf("no git: %v", err)
	}
	ctx := context.Background()
	dir := t.TempDir()
	if _, err := gitCommit(ctx, runCommand, dir); err == nil {
		t.Fatalf("gitCommit of %s, not a checkout, succeeded", dir)
	}
	git(t, dir, "init", "-q")
	if err := os.WriteFile(filepath.Join(dir, "a"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, dir, "add", "a")
	git(t, dir, "commit", "-q", "-m", "a")
	clean, err := gitCommit(ctx, runCommand, dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(clean.Revision) != 40 || strings.HasSuffix(clean.Revision, "-dirty") {
		t.Errorf("clean tree: revision %q, want 40 hex digits", clean.Revision)
	}
	if want := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC); !clean.Time.Equal(want) {
		t.Errorf("commit time %v, want %v", clean.Time, want)
	}
	// An untracked file makes the tree dirty, as for Go's vcs.modified.
	if err := os.WriteFile(filepath.Join(dir, "b"), []byte("b"), 0o644); err != nil {
		t.Fatal(err)
	}
	dirty, err := gitCommit(ctx, runCommand, dir)
	if err != nil {
		t.Fatal(err)
	}
	if dirty.Revision != clean.Revision+"-dirty" {
		t.Errorf("dirty tree: revision %q, want %q", dirty.Revision, clean.Revision+"-dirty")
	}
}

// TestBuildBinary builds a small program the way the image's svcproxy is
// built and checks what inspectBinary accepts and refuses.
func TestBuildBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds Go programs")
	}
	if runtime.GOOS != "linux" {
		t.Skip("runs the linux binary it builds")
	}
	ctx := context.Background()
	moduleDir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	const pkg = "./deploy/image/testdata/stamp"
	out := filepath.Join(t.TempDir(), "stamp")
	b, err := buildBinary(ctx, runCommand, moduleDir, pkg, runtime.GOARCH, out)
	if err != nil {
		t.Fatal(err)
	}
	if b.Module != "github.com/svcproxy/svcproxy" || b.Version == "" || b.Path != out {
		t.Errorf("buildBinary = %+v, want module github.com/svcproxy/svcproxy, a version, path %s", b, out)
	}
	// The commit is linked in, so the program knows it even where Go
	// cannot stamp it (this may be a git worktree).
	if c, err := gitCommit(ctx, runCommand, moduleDir); err == nil {
		if b.Revision != c.Revision || !b.Created.Equal(c.Time) {
			t.Errorf("buildBinary revision %q at %v, want git's %q at %v", b.Revision, b.Created, c.Revision, c.Time)
		}
		got, err := exec.Command(out).Output()
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(got)) != c.Revision {
			t.Errorf("the program says its revision is %q, want %q", got, c.Revision)
		}
	} else {
		t.Logf("not a git checkout (%v): no revision to check", err)
	}

	other := "arm64"
	if runtime.GOARCH == "arm64" {
		other = "amd64"
	}
	cgo := filepath.Join(t.TempDir(), "cgo")
	if _, err := runCommand(ctx, moduleDir, []string{"CGO_ENABLED=1"}, "go", "build", "-o", cgo, pkg); err != nil {
		t.Fatal(err)
	}
	notELF := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, arch string
		want             []string // in the error; none: no error
	}{
		{"as built for the image", out, runtime.GOARCH, nil},
		{"another architecture", out, other, []string{"GOARCH=" + runtime.GOARCH + ", not " + other}},
		{"cgo, no -trimpath", cgo, runtime.GOARCH, []string{"CGO_ENABLED=1, not 0", "without -trimpath=true"}},
		{"dynamically linked", "/bin/sh", runtime.GOARCH, []string{"dynamically linked"}},
		{"not a Go program", notELF, runtime.GOARCH, []string{"script"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := inspectBinary(tc.path, tc.arch)
			if len(tc.want) == 0 {
				if err != nil {
					t.Errorf("inspectBinary: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("inspectBinary succeeded, want an error saying %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("inspectBinary error %q does not say %q", err, w)
				}
			}
		})
	}
}
