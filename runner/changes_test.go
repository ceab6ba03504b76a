package runner

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestChanges(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	at := func(s int) time.Time { return start.Add(time.Duration(s) * time.Second) }
	type step struct {
		clock   int // seconds after start, before the op
		op      func(c *Changes)
		pending [2]int // endpoints, services after the op
	}
	ep := func(svc string, trig int) func(*Changes) {
		return func(c *Changes) {
			var tt time.Time
			if trig != 0 {
				tt = at(trig)
			}
			c.Received(true, svc, tt)
		}
	}
	svc := func(name string) func(*Changes) { return func(c *Changes) { c.Received(false, name, time.Time{}) } }
	cut := func(c *Changes) { c.Cut() }
	written := func(v uint64) func(*Changes) { return func(c *Changes) { c.Written(v) } }
	programmed := func(v uint64) func(*Changes) { return func(c *Changes) { c.Programmed(v) } }
	tests := []struct {
		name       string
		steps      []step
		wantCount  uint64  // network programming samples
		wantSum    float64 // their sum, seconds
		wantEPs    float64 // endpoint changes total
		wantSvcTot float64 // service changes total
	}{
		{"endpoint change observed from its trigger time once programmed", []step{
			{10, ep("ns/a", 8), [2]int{1, 0}},
			{11, cut, [2]int{1, 0}},
			{11, written(1), [2]int{1, 0}},
			{13, programmed(1), [2]int{0, 0}},
			{20, programmed(2), [2]int{0, 0}}, // a later sync observes nothing again
		}, 1, 5, 1, 0},
		{"a failed sync (no Programmed) keeps it pending", []step{
			{10, ep("ns/a", 9), [2]int{1, 0}},
			{10, cut, [2]int{1, 0}},
			{10, written(3), [2]int{1, 0}},
			{12, programmed(2), [2]int{1, 0}}, // an older version: not this change
			{15, programmed(3), [2]int{0, 0}},
		}, 1, 6, 1, 0},
		{"programmed before Written: observed at once", []step{
			{10, ep("ns/a", 9), [2]int{1, 0}},
			{10, cut, [2]int{1, 0}},
			{11, programmed(4), [2]int{1, 0}},
			{11, written(4), [2]int{0, 0}},
		}, 1, 2, 1, 0},
		{"changes after the cut wait for the next write", []step{
			{10, ep("ns/a", 9), [2]int{1, 0}},
			{10, cut, [2]int{1, 0}},
			{10, ep("ns/b", 10), [2]int{2, 0}},
			{10, written(1), [2]int{2, 0}},
			{12, programmed(1), [2]int{1, 0}},
			{13, cut, [2]int{1, 0}},
			{13, written(2), [2]int{1, 0}},
			{14, programmed(2), [2]int{0, 0}},
		}, 2, 3 + 4, 2, 0},
		{"write that changed nothing observes nothing", []step{
			{10, ep("ns/a", 9), [2]int{1, 0}},
			{10, cut, [2]int{1, 0}},
			{10, written(0), [2]int{0, 0}},
		}, 0, 0, 1, 0},
		{"no trigger time, or one from before start, is not observed", []step{
			{10, ep("ns/a", 0), [2]int{1, 0}},
			{10, ep("ns/a", -5), [2]int{2, 0}},
			{10, cut, [2]int{2, 0}},
			{10, written(1), [2]int{2, 0}},
			{10, programmed(1), [2]int{0, 0}},
		}, 0, 0, 2, 0},
		{"service changes count distinct Services pending", []step{
			{1, svc("ns/a"), [2]int{0, 1}},
			{1, svc("ns/a"), [2]int{0, 1}},
			{1, svc("ns/b"), [2]int{0, 2}},
			{1, cut, [2]int{0, 2}},
			{1, svc("ns/a"), [2]int{0, 2}}, // pending in two batches, counted once
			{1, cut, [2]int{0, 2}},         // merged: a Cut without Written
			{1, written(1), [2]int{0, 2}},
			{2, programmed(1), [2]int{0, 0}},
		}, 0, 0, 0, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			m := NewMetrics(reg)
			now := start
			c := NewChanges(m, func() time.Time { return now })
			for i, s := range tc.steps {
				now = at(s.clock)
				s.op(c)
				e, sv := c.Pending()
				if [2]int{e, sv} != s.pending {
					t.Fatalf("step %d: pending = %d endpoints, %d services; want %v", i, e, sv, s.pending)
				}
				if g := testutil.ToFloat64(m.endpointsPending); g != float64(e) {
					t.Fatalf("step %d: endpoint pending gauge = %v, want %d", i, g, e)
				}
				if g := testutil.ToFloat64(m.servicesPending); g != float64(sv) {
					t.Fatalf("step %d: service pending gauge = %v, want %d", i, g, sv)
				}
			}
			if got := histCount(t, reg, "kubeproxy_network_programming_duration_seconds", IPv4); got != tc.wantCount {
				t.Errorf("samples = %d, want %d", got, tc.wantCount)
			}
			if got := histSum(t, reg, "kubeproxy_network_programming_duration_seconds"); got != tc.wantSum {
				t.Errorf("sum = %v, want %v", got, tc.wantSum)
			}
			if got := testutil.ToFloat64(m.endpointsTotal); got != tc.wantEPs {
				t.Errorf("endpoint changes total = %v, want %v", got, tc.wantEPs)
			}
			if got := testutil.ToFloat64(m.servicesTotal); got != tc.wantSvcTot {
				t.Errorf("service changes total = %v, want %v", got, tc.wantSvcTot)
			}
		})
	}
}

func histSum(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()[0].GetHistogram().GetSampleSum()
		}
	}
	t.Fatalf("%s not found", name)
	return 0
}
