package vmtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
)

// Initramfs builds a cpio "newc" archive, the format the kernel unpacks
// into its initial root file system. Parent directories are added before
// their children; each path is added once (the first wins).
type Initramfs struct {
	entries []cpioEntry
	seen    map[string]bool
}

type cpioEntry struct {
	name         string // without the leading slash
	mode         uint32 // type and permission bits
	data         []byte // file contents or symlink target
	hostPath     string // file contents from the host, read when written
	rmajor, rmin uint32 // device numbers
}

// The file type bits of a cpio mode.
const (
	modeDir     = 0o040000
	modeFile    = 0o100000
	modeSymlink = 0o120000
	modeCharDev = 0o020000
)

// NewInitramfs returns an archive with /dev/console, /dev/null, /proc,
// /sys, /run and /tmp.
func NewInitramfs() *Initramfs {
	r := &Initramfs{seen: map[string]bool{}}
	r.AddCharDev("/dev/console", 5, 1)
	r.AddCharDev("/dev/null", 1, 3)
	for _, d := range []string{"/proc", "/sys", "/run", "/tmp"} {
		r.AddDir(d)
	}
	return r
}

func (r *Initramfs) add(e cpioEntry) {
	e.name = strings.TrimPrefix(path.Clean("/"+e.name), "/")
	if r.seen[e.name] {
		return
	}
	if dir := path.Dir(e.name); dir != "." {
		r.AddDir(dir)
	}
	r.seen[e.name] = true
	r.entries = append(r.entries, e)
}

// AddDir adds a directory (mode 0755) and its parents.
func (r *Initramfs) AddDir(name string) { r.add(cpioEntry{name: name, mode: modeDir | 0o755}) }

// AddFile adds a file with the given contents and permissions.
func (r *Initramfs) AddFile(name string, data []byte, perm os.FileMode) {
	r.add(cpioEntry{name: name, mode: modeFile | uint32(perm.Perm()), data: data})
}

// AddFileFrom adds the host file src as name.
func (r *Initramfs) AddFileFrom(name, src string, perm os.FileMode) {
	r.add(cpioEntry{name: name, mode: modeFile | uint32(perm.Perm()), hostPath: src})
}

// AddSymlink adds a symbolic link name -> target.
func (r *Initramfs) AddSymlink(name, target string) {
	r.add(cpioEntry{name: name, mode: modeSymlink | 0o777, data: []byte(target)})
}

// AddCharDev adds a character device node.
func (r *Initramfs) AddCharDev(name string, major, minor uint32) {
	r.add(cpioEntry{name: name, mode: modeCharDev | 0o600, rmajor: major, rmin: minor})
}

// AddHostFile copies the host file p to the same path, with every symbolic
// link on the way (a merged-/usr /lib -> usr/lib, alternatives) as a link,
// so the same path resolves inside.
func (r *Initramfs) AddHostFile(p string) error {
	return r.addHostPath(filepath.Clean(p), 0)
}

func (r *Initramfs) addHostPath(p string, depth int) error {
	if depth > 16 {
		return fmt.Errorf("too many symbolic links resolving %s", p)
	}
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	cur := "/"
	for i, part := range parts {
		next := filepath.Join(cur, part)
		fi, err := os.Lstat(next)
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(next)
			if err != nil {
				return err
			}
			r.AddSymlink(next, target)
			if !filepath.IsAbs(target) {
				target = filepath.Join(cur, target)
			}
			rest := filepath.Join(append([]string{target}, parts[i+1:]...)...)
			return r.addHostPath(rest, depth+1)
		case fi.IsDir():
			if i == len(parts)-1 {
				return fmt.Errorf("%s is a directory", p)
			}
			r.AddDir(next)
			cur = next
		default:
			if i != len(parts)-1 {
				return fmt.Errorf("%s: %s is not a directory", p, next)
			}
			r.AddFileFrom(next, next, fi.Mode())
		}
	}
	return nil
}

var lddPathRE = regexp.MustCompile(`(/\S+)\s+\(0x`)

// AddHostBinary adds the host program p (found on PATH when not absolute)
// and every shared library ldd says it needs.
func (r *Initramfs) AddHostBinary(p string) error {
	if !filepath.IsAbs(p) {
		lp, err := exec.LookPath(p)
		if err != nil {
			return err
		}
		p = lp
	}
	if err := r.AddHostFile(p); err != nil {
		return err
	}
	return r.AddHostLibraries(p)
}

// AddHostLibraries adds the shared libraries ldd lists for the host files.
func (r *Initramfs) AddHostLibraries(files ...string) error {
	if len(files) == 0 {
		return nil
	}
	out, err := exec.Command("ldd", files...).Output()
	if err != nil && len(out) == 0 {
		return fmt.Errorf("ldd %s: %w", strings.Join(files, " "), err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if g := lddPathRE.FindStringSubmatch(sc.Text()); g != nil {
			if err := r.AddHostFile(g[1]); err != nil {
				return err
			}
		}
	}
	return nil
}

// WriteTo writes the archive.
func (r *Initramfs) WriteTo(w io.Writer) (int64, error) {
	cw := &countingWriter{w: bufio.NewWriterSize(w, 1<<20)}
	for i, e := range r.entries {
		data := e.data
		if e.hostPath != "" {
			b, err := os.ReadFile(e.hostPath)
			if err != nil {
				return cw.n, err
			}
			data = b
		}
		if err := writeCPIO(cw, uint32(i+1), e, data); err != nil {
			return cw.n, err
		}
	}
	if err := writeCPIO(cw, 0, cpioEntry{name: "TRAILER!!!", mode: 0}, nil); err != nil {
		return cw.n, err
	}
	return cw.n, cw.w.(*bufio.Writer).Flush()
}

func writeCPIO(w io.Writer, ino uint32, e cpioEntry, data []byte) error {
	nlink := uint32(1)
	if e.mode&0o170000 == modeDir {
		nlink = 2
	}
	name := e.name + "\x00"
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		ino, e.mode, 0, 0, nlink, 0, len(data), 0, 0, e.rmajor, e.rmin, len(name), 0)
	if _, err := io.WriteString(w, hdr+name+pad(len(hdr)+len(name))); err != nil {
		return err
	}
	if _, err := w.Write(data); err != nil {
		return err
	}
	_, err := io.WriteString(w, pad(len(data)))
	return err
}

func pad(n int) string { return strings.Repeat("\x00", (4-n%4)%4) }

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// IPTablesLegacyTools are the host programs AddIPTablesLegacy copies.
var IPTablesLegacyTools = []string{
	"/usr/sbin/xtables-legacy-multi", "/usr/sbin/iptables-legacy", "/usr/sbin/iptables-legacy-restore",
	"/usr/sbin/iptables-legacy-save", "/usr/sbin/ipset",
}

// AddIPTablesLegacy copies iptables-legacy, ipset, their libraries, the
// iptables extensions and /etc/protocols (they resolve "tcp" with
// getprotobyname) into the initramfs. It adds nothing when one of the
// tools is missing on the host.
func (r *Initramfs) AddIPTablesLegacy() error {
	for _, p := range IPTablesLegacyTools {
		if _, err := os.Stat(p); err != nil {
			return err
		}
	}
	for _, p := range IPTablesLegacyTools {
		if err := r.AddHostBinary(p); err != nil {
			return err
		}
	}
	if err := r.AddHostFile("/etc/protocols"); err != nil {
		return err
	}
	exts, _ := filepath.Glob("/usr/lib/x86_64-linux-gnu/xtables/*.so")
	for _, x := range exts {
		if err := r.AddHostFile(x); err != nil {
			return err
		}
	}
	return r.AddHostLibraries(exts...)
}

// WriteFile writes the archive to path and returns its size.
func (r *Initramfs) WriteFile(path string) (int64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	n, err := r.WriteTo(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// BuildStatic builds the Go package pkg as a static linux/amd64 binary at
// out, for the guest: /init or a program it runs.
func BuildStatic(ctx context.Context, out, pkg string) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	build := exec.CommandContext(ctx, goBin, "build", "-o", out, pkg)
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %w\n%s", pkg, err, b)
	}
	return nil
}
