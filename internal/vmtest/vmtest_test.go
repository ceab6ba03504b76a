package vmtest

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// readCPIO parses a newc archive: name -> (mode, data).
func readCPIO(t *testing.T, b []byte) (names []string, modes map[string]uint32, data map[string]string, dev map[string][2]uint32) {
	t.Helper()
	modes, data, dev = map[string]uint32{}, map[string]string{}, map[string][2]uint32{}
	field := func(h []byte, i int) uint32 {
		v, err := strconv.ParseUint(string(h[6+8*i:6+8*i+8]), 16, 32)
		if err != nil {
			t.Fatalf("bad header field %d: %q", i, h)
		}
		return uint32(v)
	}
	align := func(n int) int { return (n + 3) &^ 3 }
	for off := 0; ; {
		if off+110 > len(b) || string(b[off:off+6]) != "070701" {
			t.Fatalf("bad header at %d: %q", off, b[off:min(off+110, len(b))])
		}
		h := b[off : off+110]
		mode, size, namesize := field(h, 1), int(field(h, 6)), int(field(h, 11))
		name := string(b[off+110 : off+110+namesize-1])
		off = align(off + 110 + namesize)
		body := string(b[off : off+size])
		off = align(off + size)
		if name == "TRAILER!!!" {
			if off != len(b) {
				t.Errorf("%d bytes after the trailer", len(b)-off)
			}
			return
		}
		names = append(names, name)
		modes[name], data[name], dev[name] = mode, body, [2]uint32{field(h, 9), field(h, 10)}
	}
}

func TestInitramfs(t *testing.T) {
	dir := t.TempDir()
	host := filepath.Join(dir, "usr", "lib", "real.so")
	if err := os.MkdirAll(filepath.Dir(host), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(host, []byte("library"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A merged-/usr style directory link and a file link.
	if err := os.Symlink("usr/lib", filepath.Join(dir, "lib")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real.so", filepath.Join(dir, "usr", "lib", "link.so")); err != nil {
		t.Fatal(err)
	}
	r := NewInitramfs()
	r.AddFile("/init", []byte("#!"), 0o755)
	r.AddFile("/etc/x/y", []byte("abcde"), 0o644)
	r.AddSymlink("/bin/sh", "busybox")
	if err := r.AddHostFile(filepath.Join(dir, "lib", "link.so")); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	n, err := r.WriteTo(&buf)
	if err != nil || n != int64(buf.Len()) {
		t.Fatalf("WriteTo: %d, %v (wrote %d)", n, err, buf.Len())
	}
	names, modes, data, dev := readCPIO(t, buf.Bytes())
	if modes["dev/console"] != modeCharDev|0o600 || dev["dev/console"] != [2]uint32{5, 1} {
		t.Errorf("dev/console: mode %o dev %v", modes["dev/console"], dev["dev/console"])
	}
	if data["init"] != "#!" || modes["init"] != modeFile|0o755 {
		t.Errorf("init: %q %o", data["init"], modes["init"])
	}
	if data["etc/x/y"] != "abcde" || modes["etc/x"] != modeDir|0o755 {
		t.Errorf("etc/x/y: %q, etc/x mode %o", data["etc/x/y"], modes["etc/x"])
	}
	if slices.Index(names, "etc/x") > slices.Index(names, "etc/x/y") || slices.Index(names, "etc") > slices.Index(names, "etc/x") {
		t.Errorf("a directory after its contents: %v", names)
	}
	if data["bin/sh"] != "busybox" || modes["bin/sh"] != modeSymlink|0o777 {
		t.Errorf("bin/sh: %q %o", data["bin/sh"], modes["bin/sh"])
	}
	rel := dir[1:]
	if data[rel+"/lib"] != "usr/lib" || data[rel+"/usr/lib/link.so"] != "real.so" || data[rel+"/usr/lib/real.so"] != "library" {
		t.Errorf("host file with links: lib %q link.so %q real.so %q", data[rel+"/lib"], data[rel+"/usr/lib/link.so"], data[rel+"/usr/lib/real.so"])
	}
	if n := len(names); n != len(slices.Compact(slices.Clone(names))) {
		t.Errorf("duplicate entries: %v", names)
	}
}

func TestParseResults(t *testing.T) {
	console := "SeaBIOS\r\n[    1.0] random kernel line\nVMTEST PASS a\n[    2.0] kernel: VMTEST FAIL b: went wrong\nVMTEST NOTE c\nVMTEST PASS d\nVMTEST DONE pass=2 fail=1\n"
	r := ParseResults(console)
	if !slices.Equal(r.Pass, []string{"a", "d"}) || !slices.Equal(r.Fail, []string{"b: went wrong"}) || !slices.Equal(r.Notes, []string{"c"}) || !r.Done {
		t.Errorf("ParseResults: %+v", r)
	}
	if ParseResults("VMTEST PASS a\n").Done {
		t.Error("Done without the DONE line")
	}
}

func TestNewestKernelOrder(t *testing.T) {
	names := []string{"linux-image-6.1.0-9-cloud-amd64", "linux-image-6.1.0-56-cloud-amd64", "linux-image-6.1.0-47-cloud-amd64"}
	slices.SortFunc(names, compareVersions)
	if names[2] != "linux-image-6.1.0-56-cloud-amd64" {
		t.Errorf("newest: %v", names)
	}
	for _, n := range []string{"linux-image-6.1.0-56-cloud-amd64-dbg", "linux-image-6.1.0-56-cloud-amd64-unsigned", "linux-image-cloud-amd64"} {
		if kernelPackageRE.MatchString(n) {
			t.Errorf("%s matched", n)
		}
	}
}

func TestModulesFromCache(t *testing.T) {
	k := cachedKernel(CacheDir())
	if k == nil {
		t.Skip("no kernel in the cache (the IPVS VM test fetches one)")
	}
	mods, err := k.Modules("ip_vs", "xt_MASQUERADE")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range mods {
		names = append(names, m.Name)
	}
	pos := func(n string) int { return slices.Index(names, n) }
	for _, dep := range [][2]string{{"nf_conntrack", "ip_vs"}, {"nf_defrag_ipv4", "nf_conntrack"}, {"nf_nat", "xt_MASQUERADE"}, {"x_tables", "xt_MASQUERADE"}} {
		if pos(dep[0]) < 0 || pos(dep[0]) > pos(dep[1]) {
			t.Errorf("%s must come before %s: %v", dep[0], dep[1], names)
		}
	}
	if _, err := k.Modules("no_such_module"); err == nil {
		t.Error("a missing module resolved")
	}
}
