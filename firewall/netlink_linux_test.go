package firewall

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestNoNFTables: a kernel without nf_tables refuses the netlink socket
// itself (seen in the VM soak's kernel: "opening an nf_tables netlink
// socket: socket: protocol not supported"); that, and only that, means
// there is no table to delete.
func TestNoNFTables(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("opening an nf_tables netlink socket: %w", os.NewSyscallError("socket", unix.EPROTONOSUPPORT)), true},
		{fmt.Errorf("opening an nf_tables netlink socket: %w", os.NewSyscallError("socket", unix.EAFNOSUPPORT)), true},
		{fmt.Errorf("deleting: %w", unix.EPERM), false},
		{errors.New("netlink receive: no such file or directory"), false},
	} {
		if got := noNFTables(tc.err); got != tc.want {
			t.Errorf("noNFTables(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
