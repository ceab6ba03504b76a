package e2e

import (
	"sync"
	"sync/atomic"

	"github.com/svcproxy/svcproxy/internal/topology"
)

// load is GET requests from a client to Services, four at a time, until
// stopped.
type load struct {
	ok, failed atomic.Int64
	firstErr   atomic.Value // string: the first failure
	stop       func()       // ends the load and waits for its requests
}

// startLoad sends requests from h to addrs in turn, from four workers,
// until the returned load is stopped (at the latest when the test ends).
func (c *cluster) startLoad(h *topology.Host, addrs ...string) *load {
	l := &load{}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				if _, err := c.get(h, addrs[i%len(addrs)]); err != nil {
					l.failed.Add(1)
					l.firstErr.CompareAndSwap(nil, err.Error())
				} else {
					l.ok.Add(1)
				}
			}
		}()
	}
	l.stop = sync.OnceFunc(func() { close(done); wg.Wait() })
	c.t.Cleanup(l.stop) // before the namespaces go, when the test stops early
	return l
}
