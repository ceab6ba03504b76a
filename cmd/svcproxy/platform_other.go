//go:build !linux

package main

import (
	"errors"
	"fmt"
	"runtime"
)

// linuxOnly fails: what (a kernel mode, steering) needs Linux's netfilter.
// Only the userspace mode with frontends bound directly runs here.
func linuxOnly(what string) error {
	return fmt.Errorf("%s: %w on %s", what, errors.ErrUnsupported, runtime.GOOS)
}
