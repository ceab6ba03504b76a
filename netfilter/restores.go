package netfilter

import (
	"context"
	"sync/atomic"
)

// RestoreFailures counts a Reconciler's iptables-restore runs that failed,
// by family: kube-proxy's
// kubeproxy_sync_proxy_rules_iptables_restore_failures_total, which each
// mode exports. The zero value is ready; it is safe for concurrent use.
type RestoreFailures struct{ n [2]atomic.Uint64 }

// Restore runs r.IPTablesRestore and counts it when it fails.
func (c *RestoreFailures) Restore(ctx context.Context, r Tools, family Family, data []byte) error {
	err := r.IPTablesRestore(ctx, family, data)
	if err != nil && int(family) < len(c.n) {
		c.n[family].Add(1)
	}
	return err
}

// Count is how many runs for family failed so far.
func (c *RestoreFailures) Count(family Family) uint64 {
	if int(family) >= len(c.n) {
		return 0
	}
	return c.n[family].Load()
}
