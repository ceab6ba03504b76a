//go:build !linux

package offload

import "fmt"

// Sockmap is Linux only; elsewhere New fails.
type Sockmap struct{}

// New fails: BPF sockmaps are Linux only.
func New(Config) (*Sockmap, error) {
	return nil, fmt.Errorf("%w: BPF sockmaps are Linux only", ErrUnsupported)
}

func (*Sockmap) Insert(client, backend int) (Pair, error) { return Pair{}, ErrUnsupported }
func (*Sockmap) Remove(Pair)                              {}
func (*Sockmap) Bytes(Pair) (Counts, error)               { return Counts{}, ErrUnsupported }
func (*Sockmap) Close() error                             { return nil }

// Written fails: Linux only.
func Written(fd int) (uint64, error) { return 0, ErrUnsupported }
