package main

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"
)

// command runs a program and returns its standard output: the boundary to
// go, git and mmdebstrap, so tests can stand in for them. env is added to
// this process's environment; dir empty is the current directory.
type command func(ctx context.Context, dir string, env []string, name string, args ...string) ([]byte, error)

// runCommand is command for real; a failure carries the end of the
// program's standard error.
func runCommand(ctx context.Context, dir string, env []string, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := stderr.String()
		if len(msg) > 4000 {
			msg = "…" + msg[len(msg)-4000:]
		}
		return out, fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, strings.TrimSpace(msg))
	}
	return out, nil
}

// binary is svcproxy as built for the image.
type binary struct {
	Path     string
	Module   string    // the main module's path
	Version  string    // Go's module version: a tag, a pseudo-version or "(devel)"
	Revision string    // the commit, "-dirty" when the tree had changes; empty: unknown
	Created  time.Time // the commit's time; zero: unknown
}

// commit is a checkout's state as git reports it.
type commit struct {
	Revision string // the commit, "-dirty" when the tree has changes
	Time     time.Time
}

// gitCommit reads dir's commit. It fails when dir is not in a git
// checkout or git is missing; a build then has no revision.
func gitCommit(ctx context.Context, run command, dir string) (commit, error) {
	out, err := run(ctx, dir, nil, "git", "log", "-1", "--format=%H %ct")
	if err != nil {
		return commit{}, err
	}
	rev, ts, ok := strings.Cut(strings.TrimSpace(string(out)), " ")
	sec, err := strconv.ParseInt(ts, 10, 64)
	if !ok || len(rev) < 12 || err != nil {
		return commit{}, fmt.Errorf("git log: unexpected output %q", out)
	}
	// Untracked files count, as for Go's vcs.modified.
	status, err := run(ctx, dir, nil, "git", "status", "--porcelain")
	if err != nil {
		return commit{}, err
	}
	if len(bytes.TrimSpace(status)) > 0 {
		rev += "-dirty"
	}
	return commit{Revision: rev, Time: time.Unix(sec, 0).UTC()}, nil
}

// buildBinary builds the main package pkg of the module in dir for
// linux/goarch into out: static, -trimpath, stripped of symbols but not
// of its build information, with VCS stamping on (this environment's
// GOFLAGS may turn it off) and the commit linked in for trees Go cannot
// stamp (git worktrees), which cmd/svcproxy's --version falls back to.
func buildBinary(ctx context.Context, run command, dir, pkg, goarch, out string) (binary, error) {
	c, err := gitCommit(ctx, run, dir)
	if err != nil {
		c = commit{} // not a checkout: no revision to say
	}
	ldflags := "-s -w"
	if c.Revision != "" {
		ldflags += " -X main.linkedRevision=" + c.Revision
	}
	env := []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=" + goarch}
	if _, err := run(ctx, dir, env, "go", "build", "-trimpath", "-buildvcs=true", "-ldflags="+ldflags, "-o", out, pkg); err != nil {
		return binary{}, fmt.Errorf("building %s: %w", pkg, err)
	}
	b, err := inspectBinary(out, goarch)
	if err != nil {
		return binary{}, err
	}
	b.Revision, b.Created = c.Revision, c.Time
	return b, nil
}

// inspectBinary reads the Go build information of the program at path and
// checks that it runs in the image: a static linux/goarch executable
// built with -trimpath.
func inspectBinary(path, goarch string) (binary, error) {
	f, err := elf.Open(path)
	if err != nil {
		return binary{}, fmt.Errorf("binary %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return binary{}, fmt.Errorf("binary %s: dynamically linked (it has an ELF interpreter): build it with CGO_ENABLED=0", path)
		}
	}
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return binary{}, fmt.Errorf("binary %s: no Go build information: %w", path, err)
	}
	want := map[string]string{"GOOS": "linux", "GOARCH": goarch, "CGO_ENABLED": "0", "-trimpath": "true"}
	var errs []error
	for _, s := range bi.Settings {
		if v, ok := want[s.Key]; ok {
			if s.Value != v {
				errs = append(errs, fmt.Errorf("built with %s=%s, not %s", s.Key, s.Value, v))
			}
			delete(want, s.Key)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		errs = append(errs, fmt.Errorf("built without %s=%s", k, want[k]))
	}
	if err := errors.Join(errs...); err != nil {
		return binary{}, fmt.Errorf("binary %s: %w", path, err)
	}
	return binary{Path: path, Module: bi.Main.Path, Version: bi.Main.Version}, nil
}
