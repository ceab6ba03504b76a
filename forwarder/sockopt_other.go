//go:build !linux

package forwarder

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"syscall"

	"go.uber.org/zap"
)

// defaultMark is the Mark of a Config that sets none: no mark, as there is
// no SO_MARK here.
const defaultMark = -1

// checkPlatform refuses what needs Linux: routing by original destination
// (Redirect, and the NodePort claims that go with it). A positive Mark is
// logged and dropped: it only keeps the forwarder's dials out of steering
// rules, and there are none here.
func (c *Config) checkPlatform() error {
	var errs []error
	if len(c.Redirect) > 0 {
		errs = append(errs, fmt.Errorf("redirect: routing by original destination needs SO_ORIGINAL_DST: %w on %s", errors.ErrUnsupported, runtime.GOOS))
	}
	if c.ClaimNodePorts {
		errs = append(errs, fmt.Errorf("claimNodePorts: NodePort claims go with steering rules: %w on %s", errors.ErrUnsupported, runtime.GOOS))
	}
	if c.Mark > 0 {
		c.Logger.Named("forwarder").Warn("SO_MARK is Linux-only: upstream sockets are not marked",
			zap.String("os", runtime.GOOS), zap.Int("mark", c.Mark))
		c.Mark = -1
	}
	return errors.Join(errs...)
}

// listenControl sets nothing: without SO_REUSEPORT (Windows has none;
// BSD's does not spread connections) one socket listens on each address.
var listenControl func(network, address string, c syscall.RawConn) error

// listenSockets is how many sockets listen on each address: one, whatever
// Workers says; its accept loop hands each connection to a goroutine, so
// connections still spread over cores.
func listenSockets(int) int { return 1 }

// markControl is never called here (checkPlatform drops positive marks); it
// fails rather than dial unmarked if it ever is.
func markControl(mark int) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		return fmt.Errorf("setting SO_MARK %#x on socket to %s: %w on %s", mark, address, errors.ErrUnsupported, runtime.GOOS)
	}
}

// originalDst fails: there is no SO_ORIGINAL_DST, and checkPlatform
// refuses redirect listeners.
func originalDst(*net.TCPConn) (netip.AddrPort, error) {
	return netip.AddrPort{}, fmt.Errorf("reading SO_ORIGINAL_DST: %w on %s", errors.ErrUnsupported, runtime.GOOS)
}
