//go:build !linux

package main

import "go.uber.org/zap"

// disableTHP does nothing: transparent huge pages, and the prctl that opts
// out of them, are Linux's.
func disableTHP(*zap.Logger) {}
