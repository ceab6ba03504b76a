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
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
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

// MaxSeconds is the longest timeout, in seconds, any kernel takes where
// it keeps one in jiffies (the conntrack timeouts, IPVS's): INT_MAX / HZ at
// the lowest HZ, 100, about 248 days. A kernel with a higher HZ refuses
// less (about 24.8 days at HZ=1000) with EINVAL, which svcproxy reports
// when it sets the parameter.
const MaxSeconds = math.MaxInt32 / 100

// CheckSeconds checks a timeout for such a parameter: 0 (left alone), or
// from 1s to MaxSeconds. The kernel counts whole seconds: a fraction is
// dropped.
func CheckSeconds(d time.Duration) error {
	switch {
	case d < 0:
		return fmt.Errorf("must not be negative, got %v", d)
	case d > 0 && d < time.Second:
		return fmt.Errorf("the kernel counts whole seconds: want 0 (left alone) or at least 1s, got %v", d)
	case d > MaxSeconds*time.Second:
		return fmt.Errorf("the kernel takes at most %v, got %v", MaxSeconds*time.Second, d)
	}
	return nil
}
