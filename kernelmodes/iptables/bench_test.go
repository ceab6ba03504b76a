package iptables

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/internal/kerneltest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// BenchmarkPlan measures computing every Service's rules from scratch (the
// Go side of a first full sync) at each size.
func BenchmarkPlan(b *testing.B) {
	for _, n := range []int{10, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			m, _ := newFakeMode(b, Config{Logger: zap.NewNop()})
			svcs := kerneltest.ScaleServices(n)
			snap, _ := lb.NewStore(lb.StoreOptions{}).Replace(svcs)
			b.ReportAllocs()
			for b.Loop() {
				m.plan(snap, nil)
			}
		})
	}
}

// BenchmarkApply measures the Go side of one incremental Apply (one
// endpoint changed, alternately there and back) over the Fake, at each size.
func BenchmarkApply(b *testing.B) {
	for _, n := range []int{10, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			m, f := newFakeMode(b, Config{Logger: zap.NewNop()})
			svcs := kerneltest.ScaleServices(n)
			st := lb.NewStore(lb.StoreOptions{})
			snap, _ := st.Replace(svcs)
			if err := m.Apply(context.Background(), snap, true); err != nil {
				b.Fatal(err)
			}
			changed := svcs[n/2]
			changed.Endpoints = slices.Clone(changed.Endpoints)
			changed.Endpoints[0].Addr = netip.MustParseAddrPort("10.127.0.1:9999")
			a, _ := st.Update([]lb.Service{changed}, nil)
			c, _ := st.Update([]lb.Service{svcs[n/2]}, nil)
			f.ResetCalls()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				s := a
				if i%2 == 1 {
					s = c
				}
				i++
				if err := m.Apply(context.Background(), s, false); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if n := f.CountCalls("iptables-save"); n != 0 {
				b.Errorf("an incremental Apply read the tables %d times", n)
			}
		})
	}
}

var _ = netfilter.IPv4
