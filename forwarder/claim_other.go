//go:build !linux

package forwarder

import (
	"errors"
	"fmt"
	"os"
	"runtime"
)

// claimPort fails: Config.ClaimNodePorts is refused here (checkPlatform).
func claimPort(k claimKey) (*os.File, error) {
	return nil, fmt.Errorf("claiming NodePort %v/%d: %w on %s", k.proto, k.port, errors.ErrUnsupported, runtime.GOOS)
}

// dupClaim fails, as there are no claims to hand over.
func dupClaim(k claimKey, _ *os.File) (*os.File, error) {
	return nil, fmt.Errorf("duplicating %s: %w on %s", k.socketName(), errors.ErrUnsupported, runtime.GOOS)
}
