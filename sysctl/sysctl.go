// Package sysctl owns svcproxy's access to the kernel's named parameters:
// the files under /proc/sys (sysctls) and /sys/module (module
// parameters), read and written as text. The interfaces are their
// consumers' (kernelmodes/ipvs.Sysctls, conntrack.Params); Files is the
// real implementation of both. A file under /proc/sys/net is the calling
// thread's network namespace's.
package sysctl

import (
	"os"
	"path/filepath"
	"strings"
)

// Files reads and writes the parameter files under Root.
type Files struct {
	// Root is the directory names are relative to; "": /proc/sys.
	Root string
}

// Module is where the loaded modules' parameters are, e.g.
// nf_conntrack/parameters/hashsize.
var Module = Files{Root: "/sys/module"}

func (f Files) path(name string) string {
	root := f.Root
	if root == "" {
		root = "/proc/sys"
	}
	return filepath.Join(root, filepath.FromSlash(name))
}

// Sysctl returns the value of name (e.g. net/ipv4/vs/conntrack), without
// its trailing newline.
func (f Files) Sysctl(name string) (string, error) {
	b, err := os.ReadFile(f.path(name))
	return strings.TrimSpace(string(b)), err
}

// SetSysctl writes value to name.
func (f Files) SetSysctl(name, value string) error {
	return os.WriteFile(f.path(name), []byte(value+"\n"), 0o644)
}
