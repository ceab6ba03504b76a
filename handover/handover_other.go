//go:build !linux

package handover

import (
	"errors"
	"fmt"
	"net"
	"runtime"
)

// supported fails: the exchange needs SOCK_SEQPACKET unix sockets and
// SCM_RIGHTS as Linux has them, so Take and Listen refuse at once.
func supported() error {
	return fmt.Errorf("passing sockets between processes: %w on %s", errors.ErrUnsupported, runtime.GOOS)
}

// listenPrivate, send and recv are never reached: Take and Listen check
// supported first.
func listenPrivate(string) (*net.UnixListener, error) { return nil, supported() }

func send(*net.UnixConn, string, []int) error { return supported() }

func recv(*net.UnixConn, int) ([]byte, []int, error) { return nil, nil, supported() }

func peerPID(*net.UnixConn) int { return 0 }
