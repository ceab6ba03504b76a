package sysctl

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestFiles(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "net", "netfilter"), 0o755); err != nil {
		t.Fatal(err)
	}
	name := "net/netfilter/nf_conntrack_tcp_timeout_close_wait"
	if err := os.WriteFile(filepath.Join(root, name), []byte("60\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f := Files{Root: root}
	if v, err := f.Sysctl(name); err != nil || v != "60" {
		t.Errorf("Sysctl = %q, %v; want \"60\"", v, err)
	}
	if err := f.SetSysctl(name, "3600"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, name)); string(b) != "3600\n" {
		t.Errorf("the file holds %q, want \"3600\\n\"", b)
	}
	if _, err := f.Sysctl("net/netfilter/nf_conntrack_nothing"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Sysctl of a missing parameter: %v, want ErrNotExist", err)
	}
	if got := (Files{}).path("net/ipv4/vs/conntrack"); got != "/proc/sys/net/ipv4/vs/conntrack" {
		t.Errorf("the zero Files reads %s, want /proc/sys/net/ipv4/vs/conntrack", got)
	}
	if got := Module.path("nf_conntrack/parameters/hashsize"); got != "/sys/module/nf_conntrack/parameters/hashsize" {
		t.Errorf("Module reads %s", got)
	}
}
