// Package conntracktest holds the in-memory conntrack.Table: the entries a
// test puts in, and what Delete leaves of them.
package conntracktest

import (
	"context"
	"slices"
	"sync"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/netfilter"
)

// Table is an in-memory conntrack.Table. The zero value is empty and ready.
type Table struct {
	mu      sync.Mutex
	flows   [2][]conntrack.Flow
	deletes int   // Delete calls
	err     error // what the next Delete returns
}

var _ conntrack.Table = (*Table)(nil)

// Add puts flows in family's table.
func (t *Table) Add(family netfilter.Family, flows ...conntrack.Flow) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.flows[family] = append(t.flows[family], flows...)
}

// Flows returns family's entries.
func (t *Table) Flows(family netfilter.Family) []conntrack.Flow {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.flows[family])
}

// Deletes counts the Delete calls: each is a dump of the whole table.
func (t *Table) Deletes() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.deletes
}

// FailNext makes the next Delete fail with err, deleting nothing.
func (t *Table) FailNext(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.err = err
}

// Delete implements conntrack.Table.
func (t *Table) Delete(ctx context.Context, family netfilter.Family, match func(conntrack.Flow) bool) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.deletes++
	if err := t.err; err != nil {
		t.err = nil
		return 0, err
	}
	before := len(t.flows[family])
	t.flows[family] = slices.DeleteFunc(t.flows[family], match)
	return before - len(t.flows[family]), nil
}
