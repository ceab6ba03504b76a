package kerneltest

import (
	"testing"

	"github.com/svcproxy/svcproxy/internal/topology"
)

// Do runs fn on a thread inside namespace ns (topology.Host.Do); sockets
// fn creates live there. It fails tb if the thread cannot enter or leave
// ns, or if fn ends its goroutine (t.Fatal inside fn).
func Do(tb testing.TB, ns string, fn func()) {
	tb.Helper()
	if err := (&topology.Host{NS: ns}).Do(func() error { fn(); return nil }); err != nil {
		tb.Fatalf("in namespace %s: %v", ns, err)
	}
}
