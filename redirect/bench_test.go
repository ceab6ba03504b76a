package redirect

import (
	"context"
	"fmt"
	"testing"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/conntrack/conntracktest"
	"github.com/svcproxy/svcproxy/internal/kerneltest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
	"github.com/svcproxy/svcproxy/redirect/steertable/steertabletest"
)

// BenchmarkApply measures the Go side of one incremental Apply (a Service
// added or removed, alternately) over the netfiltertest.Fake, at each size.
func BenchmarkApply(b *testing.B) {
	for _, n := range []int{10, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			f := netfiltertest.NewFake()
			r, err := New(Config{Backend: BackendIPTables, NFT: steertabletest.NewFake(), Conntrack: &conntracktest.Table{}, Mark: testMark, Exec: f, Logger: zap.NewNop()})
			if err != nil {
				b.Fatal(err)
			}
			svcs := kerneltest.ScaleServices(n)
			st := lb.NewStore(lb.StoreOptions{})
			snap, _ := st.Replace(svcs)
			ports := Ports{TCP: testTCPPort}
			if err := r.Apply(context.Background(), snap, ports, true); err != nil {
				b.Fatal(err)
			}
			extra := kerneltest.ScaleService(n)
			added, _ := st.Update([]lb.Service{extra}, nil)
			removed, _ := st.Update(nil, []lb.ServicePortName{extra.Name})
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				s := added
				if i%2 == 1 {
					s = removed
				}
				i++
				if err := r.Apply(context.Background(), s, ports, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
