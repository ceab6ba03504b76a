package main

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestPrivilegedImageRuns builds the real image as `make image` does (the
// root filesystem from Debian's mirror the first time, then from the
// cache), loads it back from the tarball, unpacks its file system and runs
// svcproxy and the tools it needs inside it, with no container runtime:
// `unshare --root` into the unpacked tree, in a network namespace of its
// own, with the /proc and /dev/null a runtime would provide.
func TestPrivilegedImageRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds svcproxy and a Debian root filesystem (minutes the first time)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: mmdebstrap's root mode, unshare --root, network namespaces")
	}
	for _, tool := range []string{"mmdebstrap", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s (make image installs mmdebstrap): %v", tool, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	out := filepath.Join(t.TempDir(), "svcproxy-image.tar")
	o, err := parseFlags([]string{"--out", out, "--module-dir", "../.."}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	built, err := build(ctx, o, runCommand, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image tarball %.1f MB, built in %v (root filesystem cache %s)", float64(fi.Size())/1e6, time.Since(start).Round(time.Second), o.CacheDir)

	latest, err := name.NewTag("svcproxy:latest")
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(out, &latest)
	if err != nil {
		t.Fatalf("loading %s from %s: %v", latest, out, err)
	}
	wantConfig, _ := built.ConfigName()
	if got, err := img.ConfigName(); err != nil || got != wantConfig {
		t.Fatalf("the tarball's %s has config %s (%v), want %s", latest, got, err, wantConfig)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	unpack(t, img, root)
	size := int64(0)
	filepath.WalkDir(root, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				size += fi.Size()
			}
		}
		return nil
	})
	t.Logf("unpacked file system: %.1f MB", float64(size)/1e6)
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mknod(filepath.Join(root, "dev/null"), syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		t.Fatal(err)
	}

	labels := cf.Config.Labels
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(cf.Config.Entrypoint, "--version"),
			"svcproxy " + labels["org.opencontainers.image.version"] + " (commit " + labels["org.opencontainers.image.revision"] + ","},
		{[]string{"iptables", "--version"}, "(nf_tables)"},
		{[]string{"iptables-legacy", "-V"}, "(legacy)"},
		{[]string{"ip6tables-nft", "-t", "nat", "-S"}, "-P PREROUTING ACCEPT"},
		{[]string{"iptables-legacy", "-t", "nat", "-S"}, "-P PREROUTING ACCEPT"},
		{[]string{"ipset", "--version"}, "ipset v"},
		{[]string{"conntrack", "--version"}, "conntrack v"},
		{[]string{"conntrack", "-L"}, "0 flow entries"},
		// svcproxy finds the image's iptables and ipset, detects the
		// backend, reads back the tables and sets and removes nothing.
		{append(cf.Config.Entrypoint, "--cleanup"), "removed every svcproxy rule and set"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			args := append([]string{"--net", "--mount", "--pid", "--fork", "--mount-proc", "--root=" + root}, tc.args...)
			cmd := exec.CommandContext(cctx, "unshare", args...)
			cmd.Env = cf.Config.Env
			got, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s in the image: %v\n%s", tc.args, err, got)
			}
			if !strings.Contains(string(got), tc.want) {
				t.Errorf("%s in the image says %q, want %q", tc.args, got, tc.want)
			}
			lines := strings.Split(strings.TrimSpace(string(got)), "\n")
			t.Logf("%s", lines[len(lines)-1])
		})
	}
}

// unpack writes img's file system, as a container would see it, into dir.
func unpack(t *testing.T, img v1.Image, dir string) {
	t.Helper()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		name := path.Clean(h.Name)
		if name == "." {
			continue
		}
		if dir := path.Dir(name); dir != "." {
			if err := root.MkdirAll(dir, 0o755); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = root.MkdirAll(name, 0o755)
		case tar.TypeReg:
			var f *os.File
			if f, err = root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600); err == nil {
				_, err = io.Copy(f, tr)
				err = errors.Join(err, f.Close())
			}
		case tar.TypeSymlink:
			err = root.Symlink(h.Linkname, name)
		case tar.TypeLink:
			err = root.Link(path.Clean(h.Linkname), name)
		default:
			t.Logf("unpack: skipping %s (type %c)", name, h.Typeflag)
			continue
		}
		if err == nil {
			err = root.Lchown(name, h.Uid, h.Gid)
		}
		if err == nil && h.Typeflag != tar.TypeSymlink {
			err = root.Chmod(name, h.FileInfo().Mode()&(os.ModePerm|os.ModeSetuid|os.ModeSetgid|os.ModeSticky))
		}
		if err != nil {
			t.Fatalf("unpacking %s: %v", name, err)
		}
	}
}
