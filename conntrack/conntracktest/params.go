package conntracktest

import (
	"io/fs"
	"maps"
	"sync"
	"syscall"

	"github.com/svcproxy/svcproxy/conntrack"
)

// Params is an in-memory conntrack.Params: a file per parameter. Reading
// one it does not hold fails as a missing file does; writing one marked
// read-only fails with EACCES, as /proc/sys does in a network namespace
// that is not the node's first (or EROFS in a container that is not
// privileged: ReadOnly's errno).
type Params struct {
	mu       sync.Mutex
	values   map[string]string
	readOnly map[string]error
}

var _ conntrack.Params = (*Params)(nil)

// NewParams holds values.
func NewParams(values map[string]string) *Params {
	return &Params{values: maps.Clone(values), readOnly: map[string]error{}}
}

// ReadOnly makes writes to names fail with errno.
func (p *Params) ReadOnly(errno syscall.Errno, names ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range names {
		p.readOnly[n] = errno
	}
}

// Sysctl implements conntrack.Params.
func (p *Params) Sysctl(name string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.values[name]
	if !ok {
		return "", &fs.PathError{Op: "open", Path: name, Err: syscall.ENOENT}
	}
	return v, nil
}

// SetSysctl implements conntrack.Params.
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

// Values returns every parameter.
func (p *Params) Values() map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.values)
}
