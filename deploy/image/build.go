package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// build makes the image o describes, writes it to o.Out and pushes it to
// o.Push. The binary and the root filesystem are made at the same time:
// one is mostly compiling, the other mostly downloading and unpacking.
func build(ctx context.Context, o options, run command, logf func(format string, args ...any)) (v1.Image, error) {
	start := time.Now()
	debArch, err := debianArch(o.Arch)
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "svcproxy-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	type built struct {
		bin binary
		err error
	}
	done := make(chan built, 1)
	go func() {
		b, err := buildBinary(ctx, run, o.ModuleDir, "./cmd/svcproxy", o.Arch, filepath.Join(work, "svcproxy"))
		done <- built{b, err}
	}()
	spec := rootfsSpec{Suite: o.Suite, Arch: debArch, Variant: "essential", Packages: rootfsPackages, Mirror: o.Mirror}
	cache := rootfsCache{Dir: o.CacheDir, MaxAge: o.RootfsMaxAge, Run: run, Logf: logf}
	rootfs, rootfsErr := cache.Get(ctx, spec)
	b := <-done
	if err := errors.Join(b.err, rootfsErr); err != nil {
		return nil, err
	}
	logf("svcproxy %s (commit %s) built for linux/%s", b.bin.Version, orUnknown(b.bin.Revision), o.Arch)

	img, err := assemble(imageSpec{
		Rootfs:          rootfs,
		RootfsCreatedBy: "mmdebstrap " + strings.Join(spec.args("rootfs.tar.gz"), " "),
		Binary:          b.bin,
		Arch:            o.Arch,
	})
	if err != nil {
		return nil, err
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("image digest: %w", err)
	}
	if o.Out != "" {
		tags, err := imageTags(o.Name, versionTag(b.bin))
		if err != nil {
			return nil, err
		}
		if err := writeTarball(o.Out, img, tags); err != nil {
			return nil, err
		}
		fi, err := os.Stat(o.Out)
		if err != nil {
			return nil, err
		}
		logf("%s: %s and %s, %s, %.1f MB (load it: docker load -i %[1]s, podman load -i %[1]s, ctr images import %[1]s)",
			o.Out, tags[0], tags[1], digest, float64(fi.Size())/1e6)
	}
	if o.Push != "" {
		if err := push(ctx, o.Push, img); err != nil {
			return nil, err
		}
		logf("pushed %s@%s", o.Push, digest)
	}
	logf("done in %v", time.Since(start).Round(time.Second))
	return img, nil
}

// imageTags are the tarball's tags: repo:version and repo:latest.
func imageTags(repo, version string) ([]name.Tag, error) {
	var tags []name.Tag
	for _, v := range []string{version, "latest"} {
		t, err := name.NewTag(repo + ":" + v)
		if err != nil {
			return nil, fmt.Errorf("--name %q: %w", repo, err)
		}
		tags = append(tags, t)
	}
	return tags, nil
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
