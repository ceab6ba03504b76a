// Package sysctl owns svcproxy's access to the kernel's named parameters:
// the files under /proc/sys (sysctls) and /sys/module (module
// parameters), read and written as text, and Ensure, the one way svcproxy
// sets one. Files is the real Params, sysctltest.Params the in-memory one;
// their consumers are kernelmodes/ipvs.Sysctls and conntrack.Params (an
// alias). A file under /proc/sys/net is the calling thread's network
// namespace's.
package sysctl

import (
	"fmt"
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

// Params reads and writes named parameters as text: Files, or a fake.
type Params interface {
	Sysctl(name string) (string, error)
	SetSysctl(name, value string) error
}

// Ensure writes want to name unless it holds it already, or keep (if not
// nil) accepts what it holds. It returns what name held ("": unreadable)
// and whether it wrote; an error names the parameter, the value and what
// it held.
func Ensure(p Params, name, want string, keep func(now string) bool) (old string, wrote bool, err error) {
	now, readErr := p.Sysctl(name)
	if readErr == nil && (now == want || keep != nil && keep(now)) {
		return now, false, nil
	}
	if readErr != nil {
		now = ""
	}
	if err := p.SetSysctl(name, want); err != nil {
		if readErr != nil {
			return "", false, fmt.Errorf("setting %s to %s: %w", name, want, err)
		}
		return now, false, fmt.Errorf("setting %s to %s (it is %s): %w", name, want, now, err)
	}
	return now, true, nil
}
