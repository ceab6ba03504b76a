package daemon

import (
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// DisableTHP opts the process out of transparent huge pages. Where THP is
// "always" (Debian's and RHEL's kernels), khugepaged collapses the pages
// the Go runtime returned after a spike back into huge pages, and RSS
// climbs back to the peak within minutes (go.dev/issue/64332; measured in
// the soak VM: 55 MiB right after a 10,000-connection spike, 137 MiB two
// minutes later). A proxy's hot path is in the kernel's socket code, not
// in TLB misses over its own heap, so predictable memory wins.
func DisableTHP(log *zap.Logger) {
	if err := unix.Prctl(unix.PR_SET_THP_DISABLE, 1, 0, 0, 0); err != nil {
		log.Debug("could not opt out of transparent huge pages", zap.Error(err))
	}
}
