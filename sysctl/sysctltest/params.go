// Package sysctltest holds the in-memory sysctl.Params: the kernel
// parameters a test gives, read and written as the files are.
package sysctltest

import (
	"io/fs"
	"maps"
	"sync"
	"syscall"

	"github.com/svcproxy/svcproxy/sysctl"
)

// Params is an in-memory sysctl.Params: a file per parameter. Reading
// one it does not hold fails as a missing file does; writing one marked
// read-only fails with EACCES, as /proc/sys does in a network namespace
// that is not the node's first (or EROFS in a container that is not
// privileged: ReadOnly's errno).
type Params struct {
	mu       sync.Mutex
	values   map[string]string
	readOnly map[string]error
}

var _ sysctl.Params = (*Params)(nil)

// NewParams holds values.
func NewParams(values map[string]string) *Params {
	p := &Params{values: map[string]string{}, readOnly: map[string]error{}}
	maps.Copy(p.values, values)
	return p
}

// ReadOnly makes writes to names fail with errno.
func (p *Params) ReadOnly(errno syscall.Errno, names ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range names {
		p.readOnly[n] = errno
	}
}

// Sysctl implements sysctl.Params.
func (p *Params) Sysctl(name string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.values[name]
	if !ok {
		return "", &fs.PathError{Op: "open", Path: name, Err: syscall.ENOENT}
	}
	return v, nil
}

// SetSysctl implements sysctl.Params.
func (p *Params) SetSysctl(name, value string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.readOnly[name]; err != nil {
		return &fs.PathError{Op: "open", Path: name, Err: err}
	}
	if _, ok := p.values[name]; !ok {
		return &fs.PathError{Op: "open", Path: name, Err: syscall.ENOENT}
	}
	p.values[name] = value
	return nil
}

// Add puts parameters in, as loading the module that has them would.
func (p *Params) Add(values map[string]string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	maps.Copy(p.values, values)
}

// Values returns every parameter.
func (p *Params) Values() map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.values)
}
