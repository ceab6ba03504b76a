//go:build linux

package netfilter

import "testing"

// TestPrivilegedReconciler runs the Reconciler's tables (incremental
// writes, repairs, failures) against the real tools of each backend, each
// case in a namespace of its own.
func TestPrivilegedReconciler(t *testing.T) {
	requirePrivileged(t)
	for _, v := range variants() {
		env := func(t *testing.T) Executor { return &Exec{NetNS: newNS(t), Variant: v} }
		t.Run(variantName(v), func(t *testing.T) {
			t.Run("partial", func(t *testing.T) { runReconcilerPartial(t, env) })
			t.Run("repairs", func(t *testing.T) { runReconcilerRepairs(t, env) })
			t.Run("failures", func(t *testing.T) { runReconcilerFailures(t, env) })
		})
	}
}
