package iface

import (
	"net/netip"
	"sync/atomic"
)

// LocalAddrs is the set of the node's own addresses, on every interface,
// kept current: what the kernel matches as a local source (iptables'
// "-m addrtype --src-type LOCAL", nftables' "fib saddr type local") for
// code that must decide it in user space, but for local routes that are
// no interface's address (ip route add local <prefix>), which it does not
// see. WatchLocalAddrs makes one. Safe for concurrent use; Has costs a
// map lookup.
type LocalAddrs struct {
	set atomic.Pointer[map[netip.Addr]struct{}]
}

// Has reports whether a is one of the node's addresses. Every loopback
// address is (the kernel routes all of 127.0.0.0/8 locally), whatever lo
// holds.
func (l *LocalAddrs) Has(a netip.Addr) bool {
	a = a.Unmap()
	if a.IsLoopback() {
		return true
	}
	m := l.set.Load()
	if m == nil {
		return false
	}
	_, ok := (*m)[a]
	return ok
}

// Len is the number of addresses in the set (loopback ones on lo
// included).
func (l *LocalAddrs) Len() int {
	if m := l.set.Load(); m != nil {
		return len(*m)
	}
	return 0
}

// addrOnLink is one address as interfaces hold it: the same address may
// be on two.
type addrOnLink struct {
	addr netip.Addr
	link int
}

// publish makes the addresses held in held the set Has answers from.
func (l *LocalAddrs) publish(held map[addrOnLink]struct{}) {
	m := make(map[netip.Addr]struct{}, len(held))
	for k := range held {
		m[k.addr] = struct{}{}
	}
	l.set.Store(&m)
}
