//go:build !linux

package forwarder

import "testing"

// benchOffloader: the sockmap offload is Linux only.
func benchOffloader(*testing.B) Offloader { return nil }
