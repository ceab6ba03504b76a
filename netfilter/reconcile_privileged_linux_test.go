//go:build linux

package netfilter_test

import (
	"testing"

	"github.com/svcproxy/svcproxy/internal/kerneltest"

	"github.com/svcproxy/svcproxy/netfilter"
)

// TestPrivilegedReconciler runs the Reconciler's tables (incremental
// writes, repairs, failures) against the real tools of each backend, each
// case in a namespace of its own.
func TestPrivilegedReconciler(t *testing.T) {
	netfilter.Privileged.Require(t)
	for _, v := range kerneltest.Variants() {
		env := func(t *testing.T) netfilter.Executor {
			return &netfilter.Exec{NetNS: netfilter.Privileged.NewNS(t), Variant: v}
		}
		t.Run(kerneltest.VariantName(v), func(t *testing.T) {
			t.Run("partial", func(t *testing.T) { runReconcilerPartial(t, env) })
			t.Run("repairs", func(t *testing.T) { runReconcilerRepairs(t, env) })
			t.Run("failures", func(t *testing.T) { runReconcilerFailures(t, env) })
		})
	}
}
