//go:build unix

package forwarder

import (
	"fmt"
	"testing"

	"golang.org/x/sys/unix"
)

// TestDialErrorBlame: a dial that failed for want of something on this host
// is never held against the backend; a refusal or timeout is.
func TestDialErrorBlame(t *testing.T) {
	for _, tc := range []struct {
		err   error
		local bool
	}{
		{unix.EMFILE, true},
		{unix.ENFILE, true},
		{unix.ENOBUFS, true},
		{unix.ENOMEM, true},
		{unix.EADDRNOTAVAIL, true},
		{fmt.Errorf("adding descriptor to epoll: %w", unix.ENOSPC), true}, // fs.epoll.max_user_watches
		{unix.ECONNREFUSED, false},
		{unix.ETIMEDOUT, false},
		{unix.EHOSTUNREACH, false},
	} {
		if got := isLocalDialError(tc.err); got != tc.local {
			t.Errorf("isLocalDialError(%v) = %v, want %v", tc.err, got, tc.local)
		}
	}
}
