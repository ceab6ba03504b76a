package ipvs

import (
	"net/netip"

	"github.com/svcproxy/svcproxy/lb"
)

// What the external tests (package ipvs_test, which may import ipvstest)
// read of the package's internals.

// VirtualService is the moby/ipvs form of a virtual server Mode writes for
// proto and addr, scheduled by sched, without persistence.
func VirtualService(proto lb.Protocol, addr netip.AddrPort, sched string) *Service {
	return toService(vsKey{proto, addr}, vsAttrs{sched: sched})
}

// RealServer is the moby/ipvs form of a real server Mode writes.
func RealServer(addr netip.AddrPort, weight int) *Destination { return toDestination(addr, weight) }

// FlagHashed is the flag the kernel sets on every virtual server it lists.
const FlagHashed = flagHashed

// Config returns the configuration m runs with, its defaults filled in.
func (m *Mode) Config() Config { return m.cfg }

// SweeperDone is closed when the sweeper running now (or the last one) has
// stopped; nil when none was ever started.
func (m *Mode) SweeperDone() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sweeperDone
}
