package sysctl

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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

func TestEnsure(t *testing.T) {
	root := t.TempDir()
	f := Files{Root: root}
	write := func(name, v string) {
		if err := os.WriteFile(filepath.Join(root, name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	atLeast := func(n string) func(string) bool {
		return func(now string) bool { return len(now) > len(n) || now > n && len(now) == len(n) }
	}
	tests := []struct {
		name, held, want string
		keep             func(string) bool
		wantOld          string
		wantWrote        bool
		wantHeld         string
	}{
		{"already so", "1", "1", nil, "1", false, "1"},
		{"written over", "0", "1", nil, "0", true, "1"},
		{"kept by keep", "9", "5", atLeast("5"), "9", false, "9"},
		{"not kept by keep", "3", "5", atLeast("5"), "3", true, "5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			write("p", tt.held)
			old, wrote, err := Ensure(f, "p", tt.want, tt.keep)
			if old != tt.wantOld || wrote != tt.wantWrote || err != nil {
				t.Errorf("Ensure = %q, %v, %v; want %q, %v, nil", old, wrote, err, tt.wantOld, tt.wantWrote)
			}
			if now, _ := f.Sysctl("p"); now != tt.wantHeld {
				t.Errorf("p holds %q, want %q", now, tt.wantHeld)
			}
		})
	}
	t.Run("unreadable, then written", func(t *testing.T) {
		if old, wrote, err := Ensure(f, "fresh", "7", nil); old != "" || !wrote || err != nil {
			t.Errorf("Ensure = %q, %v, %v; want \"\", true, nil", old, wrote, err)
		}
	})
	t.Run("a write that fails names the parameter and what it holds", func(t *testing.T) {
		ro := Files{Root: filepath.Join(root, "missing")}
		if _, _, err := Ensure(ro, "q", "1", nil); err == nil || err.Error() != "setting q to 1: open "+filepath.Join(root, "missing", "q")+": no such file or directory" {
			t.Errorf("Ensure error %v", err)
		}
		write("held", "2")
		if _, _, err := Ensure(failingWrite{f}, "held", "1", nil); err == nil || err.Error() != "setting held to 1 (it is 2): refused" {
			t.Errorf("Ensure error %v", err)
		}
	})
}

// failingWrite reads through Files and refuses every write.
type failingWrite struct{ Files }

func (failingWrite) SetSysctl(string, string) error { return errors.New("refused") }

func TestCheckSeconds(t *testing.T) {
	for _, tc := range []struct {
		d       time.Duration
		wantErr string
	}{
		{0, ""},
		{time.Second, ""},
		{1500 * time.Millisecond, ""}, // the fraction is dropped
		{24 * time.Hour, ""},
		{MaxSeconds * time.Second, ""},
		{-time.Second, "must not be negative"},
		{999 * time.Millisecond, "the kernel counts whole seconds"},
		{(MaxSeconds + 1) * time.Second, "the kernel takes at most 5965h13m56s"},
	} {
		err := CheckSeconds(tc.d)
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("CheckSeconds(%v) = %v, want %q", tc.d, err, tc.wantErr)
		}
	}
}
