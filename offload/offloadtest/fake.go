// Package offloadtest has an in-memory stand-in for offload.Sockmap: it
// records pairs and counts but moves no bytes, so a forwarder given one
// keeps relaying in user space while its offload bookkeeping runs.
package offloadtest

import (
	"fmt"
	"sync"

	"github.com/svcproxy/svcproxy/offload"
)

// Fake is an offloader in memory. The zero value is ready to use.
type Fake struct {
	// InsertErr, if set, fails every Insert (the fallback path).
	InsertErr error

	mu       sync.Mutex
	next     uint64
	pairs    map[offload.Pair]offload.Counts
	inserted int
	removed  int
}

// Insert records a pair of made-up cookies for client and backend.
func (f *Fake) Insert(client, backend int) (offload.Pair, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.InsertErr != nil {
		return offload.Pair{}, f.InsertErr
	}
	if f.pairs == nil {
		f.pairs = map[offload.Pair]offload.Counts{}
	}
	f.next += 2
	p := offload.Pair{Client: f.next - 1, Backend: f.next}
	f.pairs[p] = offload.Counts{}
	f.inserted++
	return p, nil
}

// Remove forgets p; a pair not there is no error.
func (f *Fake) Remove(p offload.Pair) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.pairs[p]; ok {
		delete(f.pairs, p)
		f.removed++
	}
}

// Bytes returns p's counts: zero unless Add set them.
func (f *Fake) Bytes(p offload.Pair) (offload.Counts, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.pairs[p]
	if !ok {
		return offload.Counts{}, fmt.Errorf("pair %v not offloaded", p)
	}
	return c, nil
}

// Add adds to the counts of every pair, as if the kernel had moved bytes.
func (f *Fake) Add(in, out uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for p, c := range f.pairs {
		f.pairs[p] = offload.Counts{In: c.In + in, Out: c.Out + out}
	}
}

// Stats returns how many pairs were inserted and removed, and how many are in.
func (f *Fake) Stats() (inserted, removed, open int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inserted, f.removed, len(f.pairs)
}
