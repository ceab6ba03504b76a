package apiserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/svcproxy/svcproxy/internal/proctest"
)

// The versions built: kube-apiserver from k8s.io/kubernetes with every
// k8s.io staging module replaced by the matching v0.x release, and the etcd
// Kubernetes v1.34 is tested with.
const (
	KubernetesVersion = "v1.34.4"
	EtcdVersion       = "v3.6.5"
)

// The throwaway modules the binaries are built from, with complete go.sum
// files so the build needs no module resolution (and is reproducible).
// Stored as .txt: a go.mod in this tree would make its folder a module.
var (
	//go:embed build/kube-apiserver/go.mod.txt
	apiserverGoMod []byte
	//go:embed build/kube-apiserver/go.sum.txt
	apiserverGoSum []byte
	//go:embed build/etcd/go.mod.txt
	etcdGoMod []byte
	//go:embed build/etcd/go.sum.txt
	etcdGoSum []byte
)

const apiserverMain = `//go:build tools

// Package tools pins the kube-apiserver command for go mod tidy.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
`

const etcdMain = `package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
`

// Binaries are the paths of the built programs.
type Binaries struct {
	APIServer string
	Etcd      string
}

// CacheDir is where the binaries are kept, outside any repository:
// $SVCPROXY_K8S_CACHE, else $XDG_CACHE_HOME/svcproxy-k8s, else
// $HOME/.cache/svcproxy-k8s, else $TMPDIR/svcproxy-k8s; then one folder
// per Kubernetes version.
func CacheDir() (string, error) {
	if d := os.Getenv("SVCPROXY_K8S_CACHE"); d != "" {
		return filepath.Join(d, KubernetesVersion), nil
	}
	base, err := os.UserCacheDir()
	if err != nil { // no $HOME: still outside the repository
		base = os.TempDir()
	}
	return filepath.Join(base, "svcproxy-k8s", KubernetesVersion), nil
}

// Build returns the cached binaries, building each one that is missing or
// was built from different module files first. The first build takes
// several minutes (kube-apiserver ≈ 7–10 min on 2 cores; etcd ≈ 1–2 min);
// logf, if set, is told when one starts and ends. Concurrent callers (other
// test processes) wait for one build through a file lock.
func Build(ctx context.Context, logf func(format string, args ...any)) (Binaries, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	dir, err := CacheDir()
	if err != nil {
		return Binaries{}, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Binaries{}, fmt.Errorf("creating cache directory: %w", err)
	}
	unlock, err := lock(filepath.Join(dir, ".lock"))
	if err != nil {
		return Binaries{}, err
	}
	defer unlock()

	bins := Binaries{APIServer: filepath.Join(dir, "kube-apiserver"), Etcd: filepath.Join(dir, "etcd")}
	for _, b := range []struct {
		name, out, pkg string
		gomod, gosum   []byte
		main           string
		mainFile       string
	}{
		{"etcd " + EtcdVersion, bins.Etcd, ".", etcdGoMod, etcdGoSum, etcdMain, "main.go"},
		{"kube-apiserver " + KubernetesVersion, bins.APIServer, "k8s.io/kubernetes/cmd/kube-apiserver", apiserverGoMod, apiserverGoSum, apiserverMain, "tools.go"},
	} {
		stamp := hash(b.gomod, b.gosum, []byte(b.main))
		if fresh(b.out, stamp) {
			continue
		}
		src := filepath.Join(dir, "src", filepath.Base(b.out))
		if err := writeModule(src, b.gomod, b.gosum, b.mainFile, b.main); err != nil {
			return Binaries{}, err
		}
		logf("building %s into %s (first time only; kube-apiserver takes several minutes)", b.name, dir)
		start := time.Now()
		tmp := b.out + ".tmp"
		cmd := exec.CommandContext(ctx, proctest.GoTool(), "build", "-trimpath", "-ldflags=-s -w", "-o", tmp, b.pkg)
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-mod=readonly")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return Binaries{}, fmt.Errorf("building %s: %v\n%s", b.name, err, tail(out.String(), 4000))
		}
		if err := os.Rename(tmp, b.out); err != nil {
			return Binaries{}, err
		}
		if err := os.WriteFile(b.out+".stamp", []byte(stamp), 0o644); err != nil {
			return Binaries{}, err
		}
		logf("built %s in %v", b.name, time.Since(start).Round(time.Second))
	}
	return bins, nil
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func hash(parts ...[]byte) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write(p)
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

func fresh(bin, stamp string) bool {
	got, err := os.ReadFile(bin + ".stamp")
	return err == nil && string(got) == stamp && exists(bin)
}

func writeModule(dir string, gomod, gosum []byte, mainFile, main string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, data := range map[string][]byte{"go.mod": gomod, "go.sum": gosum, mainFile: []byte(main)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return fmt.Errorf("writing build module: %w", err)
		}
	}
	return nil
}

// lock takes an exclusive flock on path, waiting for other processes.
func lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening build lock: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("taking build lock: %w", err)
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
