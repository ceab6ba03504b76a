//go:build !linux

package topology

import "fmt"

// Do is unsupported off Linux.
func (h *Host) Do(fn func() error) error {
	return fmt.Errorf("topology: %w: network namespaces are Linux-only", ErrUnsupported)
}

func killProcesses(string) error { return nil }

func pidAlive(int) bool { return true }
