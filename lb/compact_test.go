package lb

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"
)

// TestStoreMemoryAfterShrink grows a Store to 30,000 Services and shrinks
// it back to 3: the live heap comes back to within 1 MiB of a Store that
// only ever held the 3 (the Store's maps are rebuilt; a Go map never gives
// back its buckets: 11 MiB here without that).
func TestStoreMemoryAfterShrink(t *testing.T) {
	services := func(n int) []Service {
		out := make([]Service, n)
		for i := range out {
			out[i] = Service{
				Name:       ServicePortName{Namespace: "bulk", Name: fmt.Sprintf("s%d", i)},
				Port:       80,
				ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})},
				Endpoints: []Endpoint{{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 8080),
					Ready: true, Serving: true}},
			}
		}
		return out
	}
	heapLive := func() int64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	small := services(3)

	before := heapLive()
	fresh := newTestStore(StoreOptions{})
	if _, err := fresh.Replace(small); err != nil {
		t.Fatal(err)
	}
	freshHeap := heapLive() - before
	runtime.KeepAlive(fresh)
	fresh = nil

	before = heapLive()
	s := newTestStore(StoreOptions{})
	if _, err := s.Replace(services(30000)); err != nil {
		t.Fatal(err)
	}
	large := heapLive() - before
	if _, err := s.Replace(small); err != nil {
		t.Fatal(err)
	}
	shrunk := heapLive() - before
	runtime.KeepAlive(s)
	t.Logf("live heap: %d KiB with 3 Services, %d KiB with 30,000, %d KiB back at 3", freshHeap>>10, large>>10, shrunk>>10)
	if shrunk-freshHeap > 1<<20 {
		t.Errorf("the Store holds %d KiB more after shrinking from 30,000 Services to 3 than one that only held 3 (%d KiB), want at most 1 MiB",
			(shrunk-freshHeap)>>10, freshHeap>>10)
	}
}
