//go:build !linux

package netfilter

import (
	"context"
	"errors"
	"fmt"
)

// WatchRuleset needs Linux's nf_tables notifications.
func WatchRuleset(context.Context, WatchConfig, func()) error {
	return fmt.Errorf("subscribing to nf_tables changes: %w", errors.ErrUnsupported)
}
