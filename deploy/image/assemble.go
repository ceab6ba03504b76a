package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// binaryPath is where svcproxy is in the image, its entrypoint.
const binaryPath = "/usr/local/bin/svcproxy"

// imageSpec is what an image is assembled from.
type imageSpec struct {
	Rootfs          string // the root filesystem: a tarball, gzip-compressed or not
	RootfsCreatedBy string // how it was made, for the image's history
	Binary          binary // svcproxy, at binaryPath
	Arch            string // GOARCH
}

// created is when the image says it was made: the commit's time, so the
// same commit and root filesystem give the same image; the Unix epoch when
// unknown.
func (s imageSpec) created() time.Time {
	if s.Binary.Created.IsZero() {
		return time.Unix(0, 0).UTC()
	}
	return s.Binary.Created
}

// assemble builds the image: the root filesystem, then the binary, and
// the config.
func assemble(s imageSpec) (v1.Image, error) {
	p, ok := platforms[s.Arch]
	if !ok {
		_, err := debianArch(s.Arch)
		return nil, err
	}
	created := v1.Time{Time: s.created()}
	rootfs, err := tarball.LayerFromFile(s.Rootfs, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("root filesystem layer from %s: %w", s.Rootfs, err)
	}
	layerTar, err := binaryLayer(s.Binary.Path, s.created())
	if err != nil {
		return nil, err
	}
	bin, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("binary layer: %w", err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base,
		mutate.Addendum{Layer: rootfs, MediaType: types.OCILayer,
			History: v1.History{Created: created, CreatedBy: s.RootfsCreatedBy, Comment: "Debian root filesystem"}},
		mutate.Addendum{Layer: bin, MediaType: types.OCILayer,
			History: v1.History{Created: created, CreatedBy: "go build -trimpath ./cmd/svcproxy (CGO_ENABLED=0)", Comment: binaryPath}},
	)
	if err != nil {
		return nil, fmt.Errorf("appending layers: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant, cf.Created = "linux", s.Arch, p.variant, created
	cf.Config.Entrypoint = []string{binaryPath}
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cf.Config.Labels = s.labels()
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("writing the config: %w", err)
	}
	return img, nil
}

// labels are the image's OCI annotations of itself.
func (s imageSpec) labels() map[string]string {
	l := map[string]string{
		"org.opencontainers.image.title":       "svcproxy",
		"org.opencontainers.image.description": "svcproxy: Kubernetes Services on a node (kube-proxy alternative), with iptables, ipset and conntrack",
		"org.opencontainers.image.version":     s.Binary.Version,
		"org.opencontainers.image.created":     s.created().Format(time.RFC3339),
	}
	if s.Binary.Revision != "" {
		l["org.opencontainers.image.revision"] = s.Binary.Revision
	}
	if strings.HasPrefix(s.Binary.Module, "github.com/") {
		l["org.opencontainers.image.source"] = "https://" + s.Binary.Module
	}
	return l
}

// binaryLayer is a layer tar holding file as binaryPath, root's
// and 0755, with its parent directories, every entry dated mtime.
func binaryLayer(file string, mtime time.Time) ([]byte, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("binary layer: %w", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	name := strings.TrimPrefix(binaryPath, "/")
	var dirs []string
	for d := path.Dir(name); d != "."; d = path.Dir(d) {
		dirs = append([]string{d}, dirs...)
	}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return nil, fmt.Errorf("binary layer: %w", err)
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: int64(len(data)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
		return nil, fmt.Errorf("binary layer: %w", err)
	}
	if _, err := tw.Write(data); err != nil {
		return nil, fmt.Errorf("binary layer: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("binary layer: %w", err)
	}
	return buf.Bytes(), nil
}

// tagPattern is what a registry accepts as a tag.
var tagPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// versionTag is the tag naming b's version: Go's module version when it has
// one (a tag or a pseudo-version; "+dirty" becomes "-dirty", as tags allow
// no "+"), else the commit ("git-<12 hex>", "-dirty" kept), else "devel".
func versionTag(b binary) string {
	if v := strings.ReplaceAll(b.Version, "+", "-"); strings.HasPrefix(v, "v") && tagPattern.MatchString(v) {
		return v
	}
	if b.Revision != "" {
		rev, dirty := strings.CutSuffix(b.Revision, "-dirty")
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if dirty {
			rev += "-dirty"
		}
		return "git-" + rev
	}
	return "devel"
}

// writeTarball writes img to file as a docker load / podman load / ctr
// images import tarball carrying tags. It writes beside file and renames,
// so file is whole or as it was.
func writeTarball(file string, img v1.Image, tags []name.Tag) error {
	refs := make(map[name.Reference]v1.Image, len(tags))
	for _, t := range tags {
		refs[t] = img
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return fmt.Errorf("writing the image: %w", err)
	}
	tmp := file + ".partial"
	defer os.Remove(tmp)
	if err := tarball.MultiRefWriteToFile(tmp, refs); err != nil {
		return fmt.Errorf("writing the image to %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, file); err != nil {
		return fmt.Errorf("writing the image: %w", err)
	}
	return nil
}

// push uploads img to ref with the credentials docker login or podman
// login stored (authn.DefaultKeychain); anonymously when there are none.
func push(ctx context.Context, ref string, img v1.Image) error {
	r, err := name.ParseReference(ref)
	if err != nil {
		return fmt.Errorf("--push %q: %w", ref, err)
	}
	if err := remote.Write(r, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return fmt.Errorf("pushing to %s: %w", r, err)
	}
	return nil
}
