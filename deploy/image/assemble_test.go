package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log"
	"maps"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// rootfsEntry is a file of a synthetic root filesystem.
type rootfsEntry struct {
	name, body, link string
	typ              byte
}

// syntheticRootfs is a small root filesystem shaped like mmdebstrap's
// ("./" names, merged /usr, /usr/local/bin present).
var syntheticRootfs = []rootfsEntry{
	{name: "./", typ: tar.TypeDir},
	{name: "./bin", link: "usr/bin", typ: tar.TypeSymlink},
	{name: "./etc/", typ: tar.TypeDir},
	{name: "./etc/os-release", body: "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n", typ: tar.TypeReg},
	{name: "./usr/", typ: tar.TypeDir},
	{name: "./usr/bin/", typ: tar.TypeDir},
	{name: "./usr/local/", typ: tar.TypeDir},
	{name: "./usr/local/bin/", typ: tar.TypeDir},
	{name: "./usr/sbin/", typ: tar.TypeDir},
	{name: "./usr/sbin/xtables-nft-multi", body: "\x7fELF nft", typ: tar.TypeReg},
	{name: "./usr/sbin/iptables", link: "xtables-nft-multi", typ: tar.TypeSymlink},
}

// writeRootfs writes entries as a tar file in dir, gzip-compressed or not,
// and returns its path and the uncompressed tar's sha256 (its diff ID).
func writeRootfs(t *testing.T, dir string, compressed bool) (string, string) {
	t.Helper()
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, e := range syntheticRootfs {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: 0o755, Size: int64(len(e.body)), ModTime: time.Unix(1700000000, 0)}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw.Bytes())
	data := raw.Bytes()
	path := filepath.Join(dir, "rootfs.tar")
	if compressed {
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		if _, err := zw.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		data, path = gz.Bytes(), path+".gz"
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, "sha256:" + hex.EncodeToString(sum[:])
}

// testSpec is an image of the synthetic root filesystem and a stand-in
// binary (the assembler does not look inside it).
func testSpec(t *testing.T, compressed bool) (imageSpec, string, []byte) {
	t.Helper()
	dir := t.TempDir()
	rootfs, diffID := writeRootfs(t, dir, compressed)
	body := []byte("\x7fELF svcproxy stand-in")
	bin := filepath.Join(dir, "svcproxy")
	if err := os.WriteFile(bin, body, 0o600); err != nil { // the layer says 0755 whatever the file's mode
		t.Fatal(err)
	}
	return imageSpec{
		Rootfs:          rootfs,
		RootfsCreatedBy: "mmdebstrap --variant=essential bookworm rootfs.tar.gz",
		Binary: binary{Path: bin, Module: "github.com/svcproxy/svcproxy", Version: "v1.2.3",
			Revision: "0123456789abcdef0123456789abcdef01234567-dirty", Created: time.Date(2026, 11, 25, 8, 21, 56, 0, time.UTC)},
		Arch: "arm64",
	}, diffID, body
}

// layerFiles reads a layer's tar headers and file bodies.
func layerFiles(t *testing.T, l v1.Layer) ([]*tar.Header, map[string][]byte) {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	return readTar(t, rc)
}

func readTar(t *testing.T, r io.Reader) ([]*tar.Header, map[string][]byte) {
	t.Helper()
	var hdrs []*tar.Header
	bodies := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hdrs, bodies
		}
		if err != nil {
			t.Fatal(err)
		}
		hdrs = append(hdrs, h)
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			bodies[h.Name] = b
		}
	}
}

func TestAssemble(t *testing.T) {
	for _, compressed := range []bool{false, true} {
		name := map[bool]string{false: "tar rootfs", true: "gzip rootfs"}[compressed]
		t.Run(name, func(t *testing.T) {
			spec, rootfsDiffID, body := testSpec(t, compressed)
			img, err := assemble(spec)
			if err != nil {
				t.Fatal(err)
			}

			mt, err := img.MediaType()
			if err != nil || mt != types.OCIManifestSchema1 {
				t.Errorf("manifest media type %s (%v), want %s", mt, err, types.OCIManifestSchema1)
			}
			layers, err := img.Layers()
			if err != nil {
				t.Fatal(err)
			}
			if len(layers) != 2 {
				t.Fatalf("%d layers, want 2: the root filesystem, then the binary", len(layers))
			}
			for i, l := range layers {
				if mt, err := l.MediaType(); err != nil || mt != types.OCILayer {
					t.Errorf("layer %d: media type %s (%v), want %s", i, mt, err, types.OCILayer)
				}
			}
			if d, err := layers[0].DiffID(); err != nil || d.String() != rootfsDiffID {
				t.Errorf("layer 1 is %s (%v), want the root filesystem %s", d, err, rootfsDiffID)
			}
			hdrs, bodies := layerFiles(t, layers[1])
			var names []string
			for _, h := range hdrs {
				names = append(names, h.Name)
				if h.Uid != 0 || h.Gid != 0 || h.Mode != 0o755 || !h.ModTime.Equal(spec.Binary.Created) {
					t.Errorf("layer 2: %s is %d:%d mode %o dated %v, want 0:0 mode 755 dated %v",
						h.Name, h.Uid, h.Gid, h.Mode, h.ModTime, spec.Binary.Created)
				}
			}
			if want := []string{"usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/svcproxy"}; !slices.Equal(names, want) {
				t.Errorf("layer 2 holds %q, want %q", names, want)
			}
			if !bytes.Equal(bodies["usr/local/bin/svcproxy"], body) {
				t.Errorf("layer 2: /usr/local/bin/svcproxy is not the binary")
			}

			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cf.OS != "linux" || cf.Architecture != "arm64" || cf.Variant != "v8" {
				t.Errorf("platform %s/%s/%s, want linux/arm64/v8", cf.OS, cf.Architecture, cf.Variant)
			}
			if !slices.Equal(cf.Config.Entrypoint, []string{"/usr/local/bin/svcproxy"}) {
				t.Errorf("entrypoint %q", cf.Config.Entrypoint)
			}
			if !slices.ContainsFunc(cf.Config.Env, func(e string) bool { return strings.HasPrefix(e, "PATH=") && strings.Contains(e, "/usr/sbin") }) {
				t.Errorf("env %q: no PATH with /usr/sbin (iptables, ipset, conntrack)", cf.Config.Env)
			}
			wantLabels := map[string]string{
				"org.opencontainers.image.title":       "svcproxy",
				"org.opencontainers.image.description": spec.labels()["org.opencontainers.image.description"],
				"org.opencontainers.image.version":     "v1.2.3",
				"org.opencontainers.image.revision":    "0123456789abcdef0123456789abcdef01234567-dirty",
				"org.opencontainers.image.source":      "https://github.com/svcproxy/svcproxy",
				"org.opencontainers.image.created":     "2026-11-25T08:21:56Z",
			}
			if !maps.Equal(cf.Config.Labels, wantLabels) {
				t.Errorf("labels:\n got %v\nwant %v", cf.Config.Labels, wantLabels)
			}
			if !cf.Created.Time.Equal(spec.Binary.Created) {
				t.Errorf("created %v, want the commit's time %v", cf.Created, spec.Binary.Created)
			}
			if len(cf.History) != 2 || cf.History[0].CreatedBy != spec.RootfsCreatedBy {
				t.Errorf("history %+v, want two entries, the first %q", cf.History, spec.RootfsCreatedBy)
			}

			// The file system a container sees: the root filesystem with
			// the binary in it.
			rc := mutate.Extract(img)
			defer rc.Close()
			_, files := readTar(t, rc)
			for _, f := range []string{"etc/os-release", "usr/sbin/xtables-nft-multi", "usr/local/bin/svcproxy"} {
				if _, ok := files[f]; !ok {
					t.Errorf("the image's file system has no %s", f)
				}
			}

			// The same inputs give the same image.
			again, err := assemble(spec)
			if err != nil {
				t.Fatal(err)
			}
			d1, _ := img.Digest()
			d2, _ := again.Digest()
			if d1 != d2 {
				t.Errorf("assembling twice gave %s and %s", d1, d2)
			}
		})
	}
}

func TestAssembleRefuses(t *testing.T) {
	spec, _, _ := testSpec(t, false)
	for _, tc := range []struct {
		name   string
		change func(*imageSpec)
		want   string
	}{
		{"unknown architecture", func(s *imageSpec) { s.Arch = "sparc" }, `--arch "sparc"`},
		{"no root filesystem", func(s *imageSpec) { s.Rootfs = "/nonexistent/rootfs.tar" }, "root filesystem layer from /nonexistent/rootfs.tar"},
		{"no binary", func(s *imageSpec) { s.Binary.Path = "/nonexistent/svcproxy" }, "binary layer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec
			tc.change(&s)
			if _, err := assemble(s); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("assemble: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

func TestVersionTag(t *testing.T) {
	const rev = "0123456789abcdef0123456789abcdef01234567"
	for _, tc := range []struct {
		name string
		b    binary
		want string
	}{
		{"a release", binary{Version: "v1.2.3", Revision: rev}, "v1.2.3"},
		{"a pseudo-version, modified", binary{Version: "v0.0.0-20261125082156-0123456789ab+dirty", Revision: rev + "-dirty"},
			"v0.0.0-20261125082156-0123456789ab-dirty"},
		{"no stamped version (a worktree)", binary{Version: "(devel)", Revision: rev}, "git-0123456789ab"},
		{"no stamped version, modified", binary{Version: "(devel)", Revision: rev + "-dirty"}, "git-0123456789ab-dirty"},
		{"nothing known", binary{Version: "(devel)"}, "devel"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := versionTag(tc.b)
			if got != tc.want {
				t.Errorf("versionTag(%+v) = %q, want %q", tc.b, got, tc.want)
			}
			if _, err := name.NewTag("svcproxy:" + got); err != nil {
				t.Errorf("%q is not a valid tag: %v", got, err)
			}
		})
	}
}

// TestWriteTarball: the tarball is what docker load reads: a manifest.json
// naming both tags, the config and the layers, and each tag loads as the
// assembled image.
func TestWriteTarball(t *testing.T) {
	spec, _, _ := testSpec(t, true)
	img, err := assemble(spec)
	if err != nil {
		t.Fatal(err)
	}
	tags, err := imageTags("svcproxy", versionTag(spec.Binary))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "bin", "svcproxy-image.tar")
	if err := writeTarball(out, img, tags); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(out + ".partial"); err == nil {
		t.Errorf("%s.partial left behind", out)
	}

	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, files := readTar(t, f)
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	if len(manifest) != 1 {
		t.Fatalf("manifest.json has %d images, want 1", len(manifest))
	}
	// go-containerregistry writes the tags from a map: in any order, which
	// `docker load` does not mind.
	slices.Sort(manifest[0].RepoTags)
	if want := []string{"svcproxy:latest", "svcproxy:v1.2.3"}; !slices.Equal(manifest[0].RepoTags, want) {
		t.Errorf("manifest.json tags %q, want %q", manifest[0].RepoTags, want)
	}
	for _, p := range append([]string{manifest[0].Config}, manifest[0].Layers...) {
		if _, ok := files[p]; !ok {
			t.Errorf("manifest.json names %s, which the tarball does not hold", p)
		}
	}

	wantConfig, _ := img.ConfigName()
	wantLayers := diffIDs(t, img)
	for _, tag := range tags {
		loaded, err := tarball.ImageFromPath(out, &tag)
		if err != nil {
			t.Fatalf("loading %s: %v", tag, err)
		}
		if c, err := loaded.ConfigName(); err != nil || c != wantConfig {
			t.Errorf("%s: config %s (%v), want %s", tag, c, err, wantConfig)
		}
		if got := diffIDs(t, loaded); !slices.Equal(got, wantLayers) {
			t.Errorf("%s: layers %v, want %v", tag, got, wantLayers)
		}
	}
}

func diffIDs(t *testing.T, img v1.Image) []v1.Hash {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var ids []v1.Hash
	for _, l := range layers {
		d, err := l.DiffID()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, d)
	}
	return ids
}

// TestPush pushes to a registry in this process, on loopback, and reads
// the image back.
func TestPush(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	spec, _, _ := testSpec(t, true)
	img, err := assemble(spec)
	if err != nil {
		t.Fatal(err)
	}
	ref := strings.TrimPrefix(srv.URL, "http://") + "/svcproxy/svcproxy:v1.2.3"
	if err := push(context.Background(), ref, img); err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := remote.Image(r)
	if err != nil {
		t.Fatalf("pulling %s back: %v", ref, err)
	}
	want, _ := img.Digest()
	if got, err := pulled.Digest(); err != nil || got != want {
		t.Errorf("the registry holds %s (%v), want %s", got, err, want)
	}
	if mt, _ := pulled.MediaType(); mt != types.OCIManifestSchema1 {
		t.Errorf("pushed manifest media type %s, want %s", mt, types.OCIManifestSchema1)
	}

	if err := push(context.Background(), strings.TrimPrefix(srv.URL, "http://")+"/Bad Name", img); err == nil || !strings.Contains(err.Error(), "--push") {
		t.Errorf("push to a bad reference: %v, want an error naming --push", err)
	}
}
