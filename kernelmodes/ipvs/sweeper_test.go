package ipvs_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs/internal/cases"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs/ipvstest"
	"github.com/svcproxy/svcproxy/lb"
)

// TestSweeperOwnedByMode: the mode runs its own sweeper from the first
// Apply, which deletes a drained real server without anyone calling Sweep,
// and Close stops it for good.
func TestSweeperOwnedByMode(t *testing.T) {
	w := newWorld(t, ipvs.Config{SweepInterval: 10 * time.Millisecond})
	w.apply(true, cases.Web(0, 1))
	var held *ipvstest.Conn
	for range 10 {
		c := w.f.Connect(w.packet(cases.Pod, lb.TCP, cases.WebClusterIP))
		if c.Route.Action == ipvstest.Forwarded && c.Route.Backend.Addr() == cases.Backends[0] {
			held = c
			break
		}
		c.Close()
	}
	if held == nil {
		t.Fatal("could not open a connection to backend0")
	}
	w.apply(false, cases.Web(1))
	gone := held.Route.Backend.String() + " "
	has := func() bool {
		return slices.ContainsFunc(w.realServers(lb.TCP, cases.WebClusterIP), func(s string) bool { return strings.HasPrefix(s, gone) })
	}
	if !has() {
		t.Fatalf("real servers %v: want %s draining while its connection is open", w.realServers(lb.TCP, cases.WebClusterIP), gone)
	}
	held.Close()
	deadline := time.Now().Add(5 * time.Second)
	for has() {
		if time.Now().After(deadline) {
			t.Fatalf("the mode's sweeper did not delete %s within 5s of its last connection closing", gone)
		}
		time.Sleep(10 * time.Millisecond)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.m.Close(ctx, false); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-w.m.SweeperDone():
	default:
		t.Fatal("Close returned with the sweeper still running")
	}
	w.apply(true, cases.Web(1))
	restarted := w.m.SweeperDone()
	select {
	case <-restarted:
	default:
		t.Error("an Apply after Close started a sweeper again")
	}
}
