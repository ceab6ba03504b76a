package redirect

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/svcproxy/svcproxy/lb"
)

// TestSpareMembersMapAfterShrink: the members map an Apply leaves behind is
// reused by the next, unless it was sized for far more members than are
// wanted now: a map never shrinks, and after a large configuration shrinks
// its buckets would stay for good.
func TestSpareMembersMapAfterShrink(t *testing.T) {
	r, _ := newFakeRedirector(t, Config{})
	bulk := make([]lb.Service, 3000)
	for i := range bulk {
		bulk[i] = lb.Service{Name: lb.ServicePortName{Namespace: "bulk", Name: fmt.Sprintf("s%d", i)}, Port: 80,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 97, byte(i >> 8), byte(i)})}, Endpoints: eps(1, "node-b")}
	}
	small, large := store(t, testServices()...), store(t, append(testServices(), bulk...)...)
	steps := []struct {
		name      string
		snap      *lb.Snapshot
		wantSpare bool
	}{
		{"small", small.Snapshot(), false}, // nothing before it
		{"small again", small.Snapshot(), true},
		{"large", large.Snapshot(), true},              // the small one's map
		{"small after large", small.Snapshot(), false}, // not the large one's
		{"small once more", small.Snapshot(), true},
	}
	for _, st := range steps {
		mustApply(t, r, st.snap, testPorts(), false)
		if got := r.spare != nil; got != st.wantSpare {
			t.Errorf("%s: spare members map kept: %v, want %v", st.name, got, st.wantSpare)
		}
	}
}
