package vmtest

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ErrNoKernel: no kernel package could be fetched (no apt, no package lists,
// no network to the Debian mirror). Tests skip on it.
var ErrNoKernel = errors.New("no Debian cloud kernel package available")

// CacheDir is where kernels are kept: $SVCPROXY_VM_CACHE, else
// /var/cache/svcproxy-vm when it is (or can be made) writable, else
// $XDG_CACHE_HOME/svcproxy-vm (~/.cache/svcproxy-vm).
func CacheDir() string {
	if d := os.Getenv("SVCPROXY_VM_CACHE"); d != "" {
		return d
	}
	const system = "/var/cache/svcproxy-vm"
	if err := os.MkdirAll(system, 0o755); err == nil {
		if f, err := os.CreateTemp(system, ".probe"); err == nil {
			f.Close()
			os.Remove(f.Name())
			return system
		}
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "svcproxy-vm")
	}
	return filepath.Join(os.TempDir(), "svcproxy-vm")
}

// Kernel is an unpacked Debian kernel package.
type Kernel struct {
	Package string // e.g. linux-image-6.1.0-56-cloud-amd64
	Release string // e.g. 6.1.0-56-cloud-amd64
	Vmlinuz string
	Root    string // the unpacked package
}

// kernelPackageRE matches the versioned cloud kernel packages (not the
// -dbg and -unsigned ones).
var kernelPackageRE = regexp.MustCompile(`^linux-image-(6\.1\.[0-9]+-[0-9]+-cloud-amd64)$`)

// FetchKernel returns the newest linux-image-6.1.*-cloud-amd64 the apt
// lists know, downloaded and unpacked under cacheDir on first use. With no
// apt lists or no mirror it falls back to a kernel already in the cache;
// without one either, it returns an error wrapping ErrNoKernel. logf, if
// not nil, is told what is downloaded.
func FetchKernel(ctx context.Context, cacheDir string, logf func(string, ...any)) (*Kernel, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("%w: creating %s: %v", ErrNoKernel, cacheDir, err)
	}
	pkg, err := newestKernelPackage(ctx)
	if err != nil {
		if k := cachedKernel(cacheDir); k != nil {
			logf("apt has no kernel package (%v); using cached %s", err, k.Package)
			return k, nil
		}
		return nil, fmt.Errorf("%w: %v", ErrNoKernel, err)
	}
	if k := kernelAt(cacheDir, pkg); k != nil {
		return k, nil
	}
	dl, err := os.MkdirTemp(cacheDir, ".download-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dl)
	logf("downloading %s into %s", pkg, cacheDir)
	cmd := exec.CommandContext(ctx, "apt-get", "download", pkg)
	cmd.Dir = dl
	if out, err := cmd.CombinedOutput(); err != nil {
		if k := cachedKernel(cacheDir); k != nil {
			logf("apt-get download %s failed (%v); using cached %s", pkg, err, k.Package)
			return k, nil
		}
		return nil, fmt.Errorf("%w: apt-get download %s: %v: %s", ErrNoKernel, pkg, err, lastLines(out, 3))
	}
	debs, _ := filepath.Glob(filepath.Join(dl, pkg+"_*.deb"))
	if len(debs) != 1 {
		return nil, fmt.Errorf("%w: apt-get download %s left %d packages", ErrNoKernel, pkg, len(debs))
	}
	tmpRoot := filepath.Join(dl, "root")
	if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", debs[0], tmpRoot).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%w: dpkg-deb -x: %v: %s", ErrNoKernel, err, lastLines(out, 3))
	}
	if err := os.Rename(tmpRoot, filepath.Join(cacheDir, pkg)); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	if k := kernelAt(cacheDir, pkg); k != nil {
		return k, nil
	}
	return nil, fmt.Errorf("%w: %s has no vmlinuz", ErrNoKernel, pkg)
}

func newestKernelPackage(ctx context.Context) (string, error) {
	if _, err := exec.LookPath("apt-cache"); err != nil {
		return "", errors.New("apt-cache not found (not a Debian system)")
	}
	out, err := exec.CommandContext(ctx, "apt-cache", "search", "--names-only", `^linux-image-6\.1\.[0-9.-]+-cloud-amd64$`).Output()
	if err != nil {
		return "", fmt.Errorf("apt-cache search: %v", err)
	}
	var names []string
	for line := range strings.Lines(string(out)) {
		if name, _, _ := strings.Cut(line, " "); kernelPackageRE.MatchString(name) {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return "", errors.New("apt knows no linux-image-6.1.*-cloud-amd64 (run apt-get update)")
	}
	slices.SortFunc(names, compareVersions)
	return names[len(names)-1], nil
}

// compareVersions orders names by their numbers, so -56 sorts after -9.
func compareVersions(a, b string) int {
	na, nb := numbers(a), numbers(b)
	for i := range min(len(na), len(nb)) {
		if na[i] != nb[i] {
			return na[i] - nb[i]
		}
	}
	return len(na) - len(nb)
}

var digitsRE = regexp.MustCompile(`[0-9]+`)

func numbers(s string) []int {
	var out []int
	for _, d := range digitsRE.FindAllString(s, -1) {
		n, _ := strconv.Atoi(d)
		out = append(out, n)
	}
	return out
}

func kernelAt(cacheDir, pkg string) *Kernel {
	g := kernelPackageRE.FindStringSubmatch(pkg)
	if g == nil {
		return nil
	}
	root := filepath.Join(cacheDir, pkg)
	vmlinuz := filepath.Join(root, "boot", "vmlinuz-"+g[1])
	if _, err := os.Stat(vmlinuz); err != nil {
		return nil
	}
	return &Kernel{Package: pkg, Release: g[1], Vmlinuz: vmlinuz, Root: root}
}

func cachedKernel(cacheDir string) *Kernel {
	ents, _ := os.ReadDir(cacheDir)
	var names []string
	for _, e := range ents {
		if kernelAt(cacheDir, e.Name()) != nil {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		return nil
	}
	slices.SortFunc(names, compareVersions)
	return kernelAt(cacheDir, names[len(names)-1])
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " / ")
}

// Module is a kernel module to load, decompressed.
type Module struct {
	Name string
	Path string // an uncompressed .ko (in the cache)
}

// Modules returns the modules names need, dependencies first, each once;
// names built into the kernel are left out. Compressed modules are
// decompressed into the cache with the xz or zstd tool.
func (k *Kernel) Modules(names ...string) ([]Module, error) {
	modDir := filepath.Join(k.Root, "lib", "modules", k.Release)
	index := map[string]string{}
	err := filepath.WalkDir(filepath.Join(modDir, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		base := d.Name()
		for _, ext := range []string{".ko", ".ko.xz", ".ko.zst", ".ko.gz"} {
			if strings.HasSuffix(base, ext) {
				index[modName(strings.TrimSuffix(base, ext))] = p
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("indexing modules: %w", err)
	}
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(modDir, "modules.builtin")); err == nil {
		for line := range strings.Lines(string(b)) {
			base := filepath.Base(strings.TrimSpace(line))
			builtin[modName(strings.TrimSuffix(base, ".ko"))] = true
		}
	}
	var out []Module
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name string, optional bool) error
	visit = func(name string, optional bool) error {
		name = modName(name)
		if builtin[name] || state[name] == 2 {
			return nil
		}
		if state[name] == 1 {
			return fmt.Errorf("module dependency cycle through %s", name)
		}
		p, ok := index[name]
		if !ok {
			if optional {
				return nil
			}
			return fmt.Errorf("module %s not found in %s", name, k.Package)
		}
		state[name] = 1
		ko, err := k.uncompressed(p)
		if err != nil {
			return err
		}
		deps, soft, err := modinfo(ko)
		if err != nil {
			return fmt.Errorf("module %s: %w", name, err)
		}
		for _, d := range deps {
			if err := visit(d, false); err != nil {
				return err
			}
		}
		for _, d := range soft {
			if err := visit(d, true); err != nil {
				return err
			}
		}
		state[name] = 2
		out = append(out, Module{Name: name, Path: ko})
		return nil
	}
	for _, n := range names {
		if err := visit(n, false); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func modName(s string) string { return strings.ReplaceAll(s, "-", "_") }

// uncompressed returns p, or a decompressed copy of it in the cache.
func (k *Kernel) uncompressed(p string) (string, error) {
	var tool string
	switch {
	case strings.HasSuffix(p, ".ko"):
		return p, nil
	case strings.HasSuffix(p, ".xz"):
		tool = "xz"
	case strings.HasSuffix(p, ".zst"):
		tool = "zstd"
	case strings.HasSuffix(p, ".gz"):
		tool = "gzip"
	}
	dst := filepath.Join(k.Root, "decompressed", strings.TrimSuffix(filepath.Base(p), filepath.Ext(p)))
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	out, err := exec.Command(tool, "-dc", p).Output()
	if err != nil {
		return "", fmt.Errorf("decompressing %s with %s: %w", p, tool, err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".ko-")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(out); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	return dst, os.Rename(tmp.Name(), dst) // concurrent runs each write whole files
}

// modinfo reads depends= and softdep= pre: from a module's .modinfo section.
func modinfo(ko string) (deps, soft []string, err error) {
	f, err := elf.Open(ko)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, nil, errors.New("no .modinfo section")
	}
	data, err := sec.Data()
	if err != nil {
		return nil, nil, err
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		key, val, ok := strings.Cut(string(kv), "=")
		if !ok {
			continue
		}
		switch key {
		case "depends":
			for _, d := range strings.Split(val, ",") {
				if d = strings.TrimSpace(d); d != "" {
					deps = append(deps, d)
				}
			}
		case "softdep":
			// "pre: a b post: c"
			pre := false
			for _, w := range strings.Fields(val) {
				switch w {
				case "pre:":
					pre = true
				case "post:":
					pre = false
				default:
					if pre {
						soft = append(soft, w)
					}
				}
			}
		}
	}
	return deps, soft, nil
}
