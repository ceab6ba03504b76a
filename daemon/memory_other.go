//go:build !linux

package daemon

import "go.uber.org/zap"

// DisableTHP does nothing: transparent huge pages, and the prctl that opts
// out of them, are Linux's.
func DisableTHP(*zap.Logger) {}
