package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeMmdebstrap stands in for mmdebstrap: it records each command line
// and writes a file at the output argument, or fails.
type fakeMmdebstrap struct {
	calls [][]string
	fail  error
}

func (f *fakeMmdebstrap) run(_ context.Context, _ string, _ []string, name string, args ...string) ([]byte, error) {
	f.calls = append(f.calls, append([]string{name}, args...))
	if f.fail != nil {
		return nil, f.fail
	}
	// The output is the argument after the suite.
	for i, a := range args {
		if a == "bookworm" || a == "trixie" {
			return nil, os.WriteFile(args[i+1], []byte("rootfs"), 0o644)
		}
	}
	return nil, errors.New("fake mmdebstrap: no suite")
}

func TestRootfsSpecArgs(t *testing.T) {
	s := rootfsSpec{Suite: "bookworm", Arch: "amd64", Variant: "essential", Packages: []string{"iptables", "conntrack", "ipset"}}
	args := s.args("out.tar.gz")
	for _, want := range []string{"--variant=essential", "--architectures=amd64", "--include=conntrack,ipset,iptables",
		"--skip=output/dev", "--dpkgopt=path-exclude=/usr/share/doc/*", "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr"} {
		if !slices.Contains(args, want) {
			t.Errorf("mmdebstrap %q: no %s", args, want)
		}
	}
	if got := args[len(args)-2:]; !slices.Equal(got, []string{"bookworm", "out.tar.gz"}) {
		t.Errorf("mmdebstrap %q ends %q, want the suite and the output", args, got)
	}
	withMirror := s
	withMirror.Mirror = "http://mirror.example/debian"
	if args := withMirror.args("out.tar.gz"); args[len(args)-1] != withMirror.Mirror {
		t.Errorf("mmdebstrap %q: the mirror is not last", args)
	}

	// The cache key changes with every input and only with them.
	reordered := s
	reordered.Packages = []string{"ipset", "iptables", "conntrack"}
	if s.key() != reordered.key() {
		t.Errorf("the package order changed the key: %s, %s", s.key(), reordered.key())
	}
	keys := map[string]string{s.key(): "base"}
	for name, change := range map[string]func(*rootfsSpec){
		"suite":    func(s *rootfsSpec) { s.Suite = "trixie" },
		"arch":     func(s *rootfsSpec) { s.Arch = "arm64" },
		"variant":  func(s *rootfsSpec) { s.Variant = "minbase" },
		"packages": func(s *rootfsSpec) { s.Packages = append(slices.Clone(s.Packages), "tcpdump") },
		"mirror":   func(s *rootfsSpec) { s.Mirror = "http://mirror.example/debian" },
	} {
		c := s
		change(&c)
		if other, ok := keys[c.key()]; ok {
			t.Errorf("changing the %s gives the key of %s: %s", name, other, c.key())
		}
		keys[c.key()] = name
	}
	if !strings.HasPrefix(s.key(), "bookworm-amd64-essential-") {
		t.Errorf("key %q does not say what it is", s.key())
	}
}

func TestRootfsCache(t *testing.T) {
	ctx := context.Background()
	spec := rootfsSpec{Suite: "bookworm", Arch: "amd64", Variant: "essential", Packages: rootfsPackages}
	now := time.Now()
	fake := &fakeMmdebstrap{}
	c := rootfsCache{Dir: filepath.Join(t.TempDir(), "rootfs"), MaxAge: time.Hour, Run: fake.run,
		Now: func() time.Time { return now }, Logf: t.Logf}

	path, err := c.Get(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(fake.calls) != 1 || fake.calls[0][0] != "mmdebstrap" {
		t.Fatalf("first Get ran %q, want mmdebstrap once", fake.calls)
	}
	if filepath.Dir(path) != c.Dir || !strings.HasSuffix(path, ".tar.gz") {
		t.Errorf("Get = %s, want a .tar.gz in %s", path, c.Dir)
	}

	steps := []struct {
		name  string
		do    func()
		spec  rootfsSpec
		makes bool // mmdebstrap runs
	}{
		{"cached", func() {}, spec, false},
		{"another suite", func() {}, rootfsSpec{Suite: "trixie", Arch: "amd64", Variant: "essential"}, true},
		{"the first still cached", func() {}, spec, false},
		{"older than MaxAge", func() { now = now.Add(2 * time.Hour) }, spec, true},
		{"made again, cached", func() {}, spec, false},
		{"MaxAge 0 keeps it forever", func() { now = now.Add(1000 * time.Hour); c.MaxAge = 0 }, spec, false},
	}
	for _, s := range steps {
		s.do()
		before := len(fake.calls)
		if _, err := c.Get(ctx, s.spec); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if made := len(fake.calls) > before; made != s.makes {
			t.Errorf("%s: mmdebstrap ran: %v, want %v", s.name, made, s.makes)
		}
	}

	// A failed run leaves the cache as it was: nothing half-written.
	fake.fail = errors.New("E: cannot download")
	failing := rootfsSpec{Suite: "bookworm", Arch: "arm64", Variant: "essential"}
	if _, err := c.Get(ctx, failing); err == nil || !strings.Contains(err.Error(), "cannot download") {
		t.Errorf("Get with mmdebstrap failing: %v, want its error", err)
	}
	entries, err := os.ReadDir(c.Dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.Contains(e.Name(), "arm64") || strings.Contains(e.Name(), "partial") {
			t.Errorf("a failed run left %s in the cache", e.Name())
		}
	}
}
