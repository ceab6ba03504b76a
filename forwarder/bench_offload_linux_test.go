package forwarder

import (
	"os"
	"testing"

	"github.com/svcproxy/svcproxy/offload"
)

// benchOffloader is a Sockmap closed after the benchmark, or nil where
// none loads (not root, or the kernel refuses it).
func benchOffloader(b *testing.B) Offloader {
	if os.Geteuid() != 0 {
		return nil
	}
	s, err := offload.New(offload.Config{MaxPairs: 1024})
	if err != nil {
		b.Logf("no sockmap target: %v", err)
		return nil
	}
	b.Cleanup(func() { s.Close() })
	return s
}
