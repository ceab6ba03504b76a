package ipvs

import (
	"os"
	"path/filepath"
	"strings"
)

// ProcSysctls is the real Sysctls: files under Root (zero value:
// /proc/sys), as seen from the calling thread's network namespace.
type ProcSysctls struct {
	Root string
}

var _ Sysctls = ProcSysctls{}

func (p ProcSysctls) path(name string) string {
	root := p.Root
	if root == "" {
		root = "/proc/sys"
	}
	return filepath.Join(root, filepath.FromSlash(name))
}

// Sysctl implements Sysctls.
func (p ProcSysctls) Sysctl(name string) (string, error) {
	b, err := os.ReadFile(p.path(name))
	return strings.TrimSpace(string(b)), err
}

// SetSysctl implements Sysctls.
func (p ProcSysctls) SetSysctl(name, value string) error {
	return os.WriteFile(p.path(name), []byte(value+"\n"), 0o644)
}
