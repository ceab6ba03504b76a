//go:build !linux

package proxymode

import (
	"errors"
	"fmt"
	"runtime"
)

// LinuxOnly fails: what (a kernel mode, steering) needs Linux's netfilter.
// Only the userspace mode with frontends bound directly runs here.
func LinuxOnly(what string) error {
	return fmt.Errorf("%s: %w on %s", what, errors.ErrUnsupported, runtime.GOOS)
}
