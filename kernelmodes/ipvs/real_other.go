//go:build !linux

package ipvs

import (
	"errors"
	"fmt"
	"runtime"
)

// unsupported says what needs Linux.
func unsupported(what string) error {
	return fmt.Errorf("%s: %w on %s", what, errors.ErrUnsupported, runtime.GOOS)
}

// Available fails: IPVS is a Linux kernel feature.
func Available() error { return fmt.Errorf("%w: %w", ErrUnavailable, unsupported("the IPVS mode")) }

// NewIPVS fails: there is no IPVS netlink family here.
func NewIPVS() (IPVS, error) { return nil, unsupported("opening IPVS netlink socket") }

// KernelRelease is "": there is no Linux kernel here.
func KernelRelease() string { return "" }
