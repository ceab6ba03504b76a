package lb

import (
	"net/netip"
	"sync"
	"time"
)

// affinityTable maps a client IP to the backend it last used, for ClientIP
// session affinity. Entries expire after the Service's timeout since their
// last use; expired entries are swept when the table has doubled since the
// last sweep, so it stays bounded by the number of recently active clients.
type affinityTable struct {
	mu        sync.Mutex
	m         map[netip.Addr]affinityEntry
	sweptSize int
}

type affinityEntry struct {
	backend  *Backend
	lastUsed time.Time
}

func (t *affinityTable) get(client netip.Addr, now time.Time, timeout time.Duration) *Backend {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.m[client]
	if !ok {
		return nil
	}
	if now.Sub(e.lastUsed) > timeout {
		delete(t.m, client)
		return nil
	}
	e.lastUsed = now
	t.m[client] = e
	return e.backend
}

func (t *affinityTable) set(client netip.Addr, b *Backend, now time.Time, timeout time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = make(map[netip.Addr]affinityEntry)
	}
	t.m[client] = affinityEntry{backend: b, lastUsed: now}
	if len(t.m) >= 2*max(t.sweptSize, 512) {
		for c, e := range t.m {
			if now.Sub(e.lastUsed) > timeout {
				delete(t.m, c)
			}
		}
		t.sweptSize = len(t.m)
	}
}
