package proctest

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestOutput(t *testing.T) {
	var o Output
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				o.Write([]byte("ab"))
			}
		})
	}
	wg.Wait()
	if got := o.String(); got != strings.Repeat("ab", 800) {
		t.Errorf("got %d bytes, want 1600 of ab", len(got))
	}
}

func TestSamples(t *testing.T) {
	s := Samples{
		`up 1`,
		`conns_total{protocol="TCP",result="ok"} 5`,
		`conns_total{protocol="TCP",result="dial_failed"} 2`,
		`conns_total{protocol="UDP",result="ok"} 7`,
		`conns 100`,
	}
	for _, tc := range []struct {
		name       string
		value, sum float64
	}{
		{"up", 1, 1},
		{`conns_total{protocol="TCP",result="ok"}`, 5, 5},
		{"conns_total", 0, 14},                 // Value: no unlabelled series; Sum: all of them
		{`conns_total{protocol="TCP"}`, 0, 7},  // a subset of the labels
		{`conns_total{result="ok"}`, 0, 12},    // another
		{`conns_total{protocol="SCTP"}`, 0, 0}, // none
		{"conns", 100, 100},                    // not conns_total
	} {
		if got := s.Value(tc.name); got != tc.value {
			t.Errorf("Value(%s) = %v, want %v", tc.name, got, tc.value)
		}
		if got := s.Sum(tc.name); got != tc.sum {
			t.Errorf("Sum(%s) = %v, want %v", tc.name, got, tc.sum)
		}
	}
}

func TestParallel(t *testing.T) {
	var mu sync.Mutex
	var ran []int
	errs := Parallel(50, 4, func(i int) error {
		mu.Lock()
		ran = append(ran, i)
		mu.Unlock()
		if i%10 == 3 {
			return errors.New("odd one")
		}
		return nil
	})
	slices.Sort(ran)
	if len(ran) != 50 || ran[0] != 0 || ran[49] != 49 {
		t.Errorf("ran %v, want 0..49 once each", ran)
	}
	if len(errs) != 5 || !strings.HasSuffix(errs[0].Error(), ": odd one") {
		t.Errorf("errors %v, want 5 prefixed with their i", errs)
	}
}

func TestProcess(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	p := Start(t, "echo", exec.Command("sh", "-c", "echo out; echo err >&2; exit 3"))
	err := p.Wait(5 * time.Second)
	if err == nil || !strings.Contains(err.Error(), "echo exited: exit status 3") {
		t.Errorf("Wait = %v, want exit status 3", err)
	}
	if !p.Exited() || p.Out.String() != "out\nerr\n" {
		t.Errorf("Exited %v, output %q", p.Exited(), p.Out)
	}

	// One that ignores SIGINT is stopped with SIGQUIT, then SIGKILL.
	stuck := Start(t, "stuck", exec.Command("sh", "-c", "trap '' INT QUIT; echo ready; while :; do sleep 0.1; done"))
	for !strings.Contains(stuck.Out.String(), "ready") {
		time.Sleep(10 * time.Millisecond)
	}
	if !Running(stuck.Cmd.Process.Pid) {
		t.Fatal("Running says the stuck process is not running")
	}
	start := time.Now()
	if err := stuck.Wait(100 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "still running") {
		t.Errorf("Wait = %v, want still running", err)
	}
	if d := time.Since(start); d < 3*time.Second {
		t.Errorf("killed after %v, before SIGQUIT's 3s", d)
	}
	if Running(stuck.Cmd.Process.Pid) {
		t.Error("Running after the kill")
	}
}
