package topology

import (
	"errors"
	"testing"
)

// NewT builds a topology for a test or benchmark: it skips tb, saying why,
// when this machine cannot (ErrUnsupported), fails it on any other error,
// and closes the topology in tb.Cleanup.
func NewT(tb testing.TB, opts Options) *Topology {
	tb.Helper()
	t, err := New(opts)
	if errors.Is(err, ErrUnsupported) {
		tb.Skipf("skipping: %v", err)
	}
	if err != nil {
		tb.Fatalf("building topology: %v", err)
	}
	tb.Cleanup(func() {
		if err := t.Close(); err != nil {
			tb.Errorf("closing topology: %v", err)
		}
	})
	return t
}
