package main

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

func TestMemoryReturner(t *testing.T) {
	cases := []struct {
		name    string
		samples []int
		frees   int
	}{
		{"steady load never frees", []int{5000, 5100, 4900, 5000, 3000}, 0},
		{"a spike that ended frees once", []int{100, 20000, 20010, 40, 40, 40}, 1},
		{"a small high is no spike", []int{100, 1500, 10, 10}, 0},
		{"exactly half is not under half", []int{4000, 2000}, 0},
		{"each new spike frees again", []int{10000, 100, 100, 8000, 8000, 50}, 2},
		{"a spike falling in steps frees once per halving, down to rest", []int{16000, 7000, 5000, 3000, 1000, 10, 10}, 4},
		{"at rest after a spike, small wobbles free nothing", []int{10000, 40, 300, 100, 1000, 400}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newMemoryReturner(prometheus.NewRegistry(), zap.NewNop(), nil)
			frees := 0
			r.free = func() { frees++ }
			var st returnState
			for _, s := range c.samples {
				r.count = func() int { return s }
				r.step(&st)
			}
			if frees != c.frees {
				t.Errorf("freed %d times, want %d", frees, c.frees)
			}
		})
	}
}
