package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// rootfsPackages are what svcproxy runs besides itself: iptables (its
// xtables-legacy-multi and xtables-nft-multi, so both backends, as
// kube-proxy's image), ipset and conntrack, with their libraries.
var rootfsPackages = []string{"conntrack", "ipset", "iptables"}

// rootfsDpkgOptions keep documentation, manual pages and translations out
// of the root filesystem (copyright files stay), as Debian's slim images do.
var rootfsDpkgOptions = []string{
	"path-exclude=/usr/share/doc/*",
	"path-include=/usr/share/doc/*/copyright",
	"path-exclude=/usr/share/man/*",
	"path-exclude=/usr/share/info/*",
	"path-exclude=/usr/share/locale/*",
	"path-exclude=/usr/share/lintian/*",
}

// platforms maps a GOARCH to its Debian architecture and OCI platform
// variant, for the architectures Debian bookworm releases.
var platforms = map[string]struct{ debian, variant string }{
	"amd64":    {"amd64", ""},
	"arm64":    {"arm64", "v8"},
	"arm":      {"armhf", "v7"},
	"386":      {"i386", ""},
	"ppc64le":  {"ppc64el", ""},
	"s390x":    {"s390x", ""},
	"mips64le": {"mips64el", ""},
}

// debianArch returns goarch's Debian architecture.
func debianArch(goarch string) (string, error) {
	p, ok := platforms[goarch]
	if !ok {
		known := make([]string, 0, len(platforms))
		for a := range platforms {
			known = append(known, a)
		}
		slices.Sort(known)
		return "", fmt.Errorf("--arch %q: no Debian architecture known for it (known: %s)", goarch, strings.Join(known, ", "))
	}
	return p.debian, nil
}

// rootfsSpec is a Debian root filesystem as mmdebstrap makes it.
type rootfsSpec struct {
	Suite    string   // Debian suite, e.g. "bookworm"
	Arch     string   // Debian architecture, e.g. "amd64"
	Variant  string   // mmdebstrap's package set, e.g. "essential"
	Packages []string // installed beyond the variant's
	Mirror   string   // empty: deb.debian.org, with -updates and -security for a stable suite
}

// args is mmdebstrap's command line writing spec to out, a gzip tarball
// (mmdebstrap picks the compression from the name).
func (s rootfsSpec) args(out string) []string {
	pkgs := slices.Clone(s.Packages)
	slices.Sort(pkgs)
	args := []string{"--variant=" + s.Variant, "--architectures=" + s.Arch, "--format=tar"}
	if len(pkgs) > 0 {
		args = append(args, "--include="+strings.Join(pkgs, ","))
	}
	// /usr merged the way debootstrap does it, which installs
	// usr-is-merged: bookworm's init-system-helpers would otherwise pull
	// in usrmerge and with it perl, 27 MB.
	args = append(args, "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr")
	for _, o := range rootfsDpkgOptions {
		args = append(args, "--dpkgopt="+o)
	}
	// mmdebstrap copies the host's resolv.conf and hostname in, and puts
	// device nodes in /dev; a container runtime provides its own, and
	// rootless podman cannot unpack device nodes.
	args = append(args, `--customize-hook=rm -f "$1/etc/resolv.conf" "$1/etc/hostname"`, "--skip=output/dev")
	args = append(args, s.Suite, out)
	if s.Mirror != "" {
		args = append(args, s.Mirror)
	}
	return args
}

// key names spec's root filesystem in the cache: readable, and changed by
// anything that changes mmdebstrap's command line.
func (s rootfsSpec) key() string {
	sum := sha256.Sum256([]byte(strings.Join(s.args("-"), "\x00")))
	return fmt.Sprintf("%s-%s-%s-%s", s.Suite, s.Arch, s.Variant, hex.EncodeToString(sum[:6]))
}

// rootfsCache makes root filesystems with mmdebstrap and keeps them.
type rootfsCache struct {
	Dir    string                           // where they are kept
	MaxAge time.Duration                    // one older than this is made again; 0: never
	Run    command                          // runs mmdebstrap
	Now    func() time.Time                 // nil: time.Now
	Logf   func(format string, args ...any) // progress
}

// Get returns the path of spec's root filesystem tarball (gzip), making it
// first when it is missing or too old.
func (c rootfsCache) Get(ctx context.Context, spec rootfsSpec) (string, error) {
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	path := filepath.Join(c.Dir, spec.key()+".tar.gz")
	fi, err := os.Stat(path)
	switch {
	case err == nil && (c.MaxAge == 0 || now().Sub(fi.ModTime()) <= c.MaxAge):
		c.Logf("root filesystem: %s (cached %s)", path, fi.ModTime().Format(time.DateOnly))
		return path, nil
	case err == nil:
		c.Logf("root filesystem: %s is older than %v: making it again", path, c.MaxAge)
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("root filesystem cache: %w", err)
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return "", fmt.Errorf("root filesystem cache: %w", err)
	}
	// mmdebstrap writes beside the cached file and the result is renamed
	// over it, so a failed or interrupted run leaves the cache as it was.
	partial := filepath.Join(c.Dir, fmt.Sprintf(".%s.partial-%d.tar.gz", spec.key(), os.Getpid()))
	defer os.Remove(partial)
	start := now()
	c.Logf("root filesystem: mmdebstrap %s (downloads Debian packages: minutes, once)", strings.Join(spec.args(path), " "))
	if _, err := c.Run(ctx, "", nil, "mmdebstrap", spec.args(partial)...); err != nil {
		return "", fmt.Errorf("making the root filesystem: %w", err)
	}
	if fi, err := os.Stat(partial); err != nil || fi.Size() == 0 {
		return "", fmt.Errorf("making the root filesystem: mmdebstrap wrote no %s (%v)", partial, err)
	}
	// Its age counts from now, on the clock the next Get reads.
	if err := os.Chtimes(partial, now(), now()); err != nil {
		return "", fmt.Errorf("root filesystem cache: %w", err)
	}
	if err := os.Rename(partial, path); err != nil {
		return "", fmt.Errorf("root filesystem cache: %w", err)
	}
	c.Logf("root filesystem: %s in %v", path, now().Sub(start).Round(time.Second))
	return path, nil
}
