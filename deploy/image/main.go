// Command image builds svcproxy's node container image without a Docker
// daemon (`make image`). It owns what the image holds and says about
// itself:
//
//   - layer 1, a Debian root filesystem made by mmdebstrap (variant
//     essential, plus iptables with both its legacy and nf_tables backends,
//     ipset and conntrack, without documentation), cached outside the
//     repository in ${XDG_CACHE_HOME:-~/.cache}/svcproxy/rootfs under a key
//     of everything that shapes it, and rebuilt when older than
//     --rootfs-max-age so security updates arrive;
//   - layer 2, svcproxy built static (CGO_ENABLED=0, -trimpath) at
//     /usr/local/bin/svcproxy, its commit stamped so --version says it;
//   - the config: entrypoint, PATH, platform and the OCI labels
//     (org.opencontainers.image.version, revision, source, created).
//
// It writes a tarball that docker load, podman load and ctr images import
// read, tagged <name>:<version> and <name>:latest (--out), or pushes to a
// registry with the credentials docker login or podman login left
// (--push). deploy/Dockerfile builds the same image with Docker.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
)

// options are the command line.
type options struct {
	Out          string        // the tarball to write; empty: none
	Push         string        // the reference to push to; empty: none
	Name         string        // the repository of the tarball's tags; "svcproxy"
	Arch         string        // GOARCH of the image; the host's
	Suite        string        // Debian suite of the root filesystem; "bookworm"
	Mirror       string        // Debian mirror; empty: deb.debian.org with -updates and -security
	CacheDir     string        // where root filesystems are kept; ${XDG_CACHE_HOME:-~/.cache}/svcproxy/rootfs
	RootfsMaxAge time.Duration // a cached root filesystem older than this is rebuilt; 0: never
	ModuleDir    string        // the svcproxy module to build from; "."
}

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "image: "+format+"\n", args...) }
	if _, err := build(ctx, o, runCommand, logf); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string, output io.Writer) (options, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	o := options{}
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.StringVar(&o.Out, "out", "", "write the image as a tarball for docker load, podman load or ctr images import")
	fs.StringVar(&o.Push, "push", "", "push the image to this reference (registry/repository:tag), with docker's or podman's stored credentials")
	fs.StringVar(&o.Name, "name", "svcproxy", "the repository the tarball's tags name")
	fs.StringVar(&o.Arch, "arch", runtime.GOARCH, "the image's architecture (GOARCH)")
	fs.StringVar(&o.Suite, "suite", "bookworm", "the Debian suite of the root filesystem")
	fs.StringVar(&o.Mirror, "mirror", "", "the Debian mirror (default deb.debian.org with the suite's updates and security)")
	fs.StringVar(&o.CacheDir, "cache-dir", filepath.Join(cache, "svcproxy", "rootfs"), "where root filesystems are cached")
	fs.DurationVar(&o.RootfsMaxAge, "rootfs-max-age", 7*24*time.Hour, "rebuild a cached root filesystem older than this (0: never)")
	fs.StringVar(&o.ModuleDir, "module-dir", ".", "the svcproxy source to build")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.Out == "" && o.Push == "" {
		return o, errors.New("nothing to do: give --out, --push or both")
	}
	if o.RootfsMaxAge < 0 {
		return o, fmt.Errorf("--rootfs-max-age %v: must not be negative", o.RootfsMaxAge)
	}
	if _, err := debianArch(o.Arch); err != nil {
		return o, err
	}
	if _, err := imageTags(o.Name, "latest"); err != nil {
		return o, err
	}
	if o.Push != "" {
		if _, err := name.ParseReference(o.Push); err != nil {
			return o, fmt.Errorf("--push %q: %w", o.Push, err)
		}
	}
	return o, nil
}
