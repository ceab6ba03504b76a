package ipvstest

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/sysctl"
)

// IPVS service flags (include/uapi/linux/ip_vs.h).
const (
	flagPersistent = 0x1
	flagHashed     = 0x2 // set by the kernel on every service it lists
)

// ipprotoSCTP is IPPROTO_SCTP, which package syscall lacks on some systems.
const ipprotoSCTP = 132

// vsName names a virtual server as the kernel identifies it (svcproxy makes
// no firewall-mark ones): "tcp/198.19.0.10:80".
func vsName(proto lb.Protocol, addr netip.AddrPort) string {
	return netfilter.ProtoName(proto) + "/" + addr.String()
}

// identify reads the protocol and address of s; ok is false for what the
// fake does not model (firewall marks, protocols other than TCP, UDP and
// SCTP).
func identify(s *ipvs.Service) (proto lb.Protocol, addr netip.AddrPort, ok bool) {
	switch s.Protocol {
	case syscall.IPPROTO_TCP:
		proto = lb.TCP
	case syscall.IPPROTO_UDP:
		proto = lb.UDP
	case ipprotoSCTP:
		proto = lb.SCTP
	default:
		return proto, addr, false
	}
	a, ok := netip.AddrFromSlice(s.Address)
	if !ok || s.FWMark != 0 {
		return proto, addr, false
	}
	return proto, netip.AddrPortFrom(a.Unmap(), s.Port), true
}

func destAddr(d *ipvs.Destination) netip.AddrPort {
	a, _ := netip.AddrFromSlice(d.Address)
	return netip.AddrPortFrom(a.Unmap(), d.Port)
}

// IPVS is an in-memory ipvs.IPVS that behaves as the kernel does for the
// calls the mode makes: the same errors (EEXIST, ESRCH for a missing virtual
// server, ENOENT for a missing real server or unknown scheduler), the hashed
// flag on every listed service, connection counts per real server.
// Fakes.Trace schedules new connections with it: rr and wrr in turn, lc and
// wlc by fewest connections, sh, dh and mh by hashing the source or
// destination address, persistence by client address. It is safe for
// concurrent use.
type IPVS struct {
	recorder
	mu       sync.Mutex
	services map[string]*virtualServer // by vsName
	order    []string                  // of creation, as the kernel lists them
	timeouts ipvs.Timeouts
	now      func() time.Time
}

// DefaultTimeouts returns the kernel's IPVS timeouts, which a new IPVS
// starts with: TCP 900s, TCP FIN 120s, UDP 300s.
func DefaultTimeouts() ipvs.Timeouts {
	return ipvs.Timeouts{TimeoutTCP: 900 * time.Second, TimeoutTCPFin: 120 * time.Second, TimeoutUDP: 300 * time.Second}
}

type virtualServer struct {
	proto     lb.Protocol
	addr      netip.AddrPort
	svc       ipvs.Service
	dests     []*realServer
	last      int // rr: index of the last real server chosen
	templates map[netip.Addr]template
}

type realServer struct {
	dest             ipvs.Destination // as added or updated
	addr             netip.AddrPort
	active, inactive int
}

type template struct {
	dest    netip.AddrPort
	expires time.Time
}

// NewIPVS returns an empty IPVS on clock now (nil: time.Now).
func NewIPVS(now func() time.Time) *IPVS {
	if now == nil {
		now = time.Now
	}
	return &IPVS{services: map[string]*virtualServer{}, timeouts: DefaultTimeouts(), now: now}
}

var _ ipvs.IPVS = (*IPVS)(nil)

// call records op on s (and d), as "Method proto/addr:port[ dest]", and
// returns the failure injected for it.
func (f *IPVS) call(op string, s *ipvs.Service, d *ipvs.Destination) error {
	var args []any
	if s != nil {
		proto, addr, _ := identify(s)
		args = append(args, vsName(proto, addr))
	}
	if d != nil {
		args = append(args, destAddr(d))
	}
	return f.record(op, args...)
}

// lookup records op on s (and d) and finds the virtual server s names.
func (f *IPVS) lookup(op string, s *ipvs.Service, d *ipvs.Destination) (*virtualServer, error) {
	if err := f.call(op, s, d); err != nil {
		return nil, err
	}
	proto, addr, ok := identify(s)
	if !ok {
		return nil, syscall.EINVAL
	}
	vs := f.services[vsName(proto, addr)]
	if vs == nil {
		return nil, syscall.ESRCH
	}
	return vs, nil
}

// lookupDest records op and finds the index of d among the real servers of
// the virtual server s names.
func (f *IPVS) lookupDest(op string, s *ipvs.Service, d *ipvs.Destination) (*virtualServer, int, error) {
	vs, err := f.lookup(op, s, d)
	if err != nil {
		return nil, 0, err
	}
	a := destAddr(d)
	i := slices.IndexFunc(vs.dests, func(x *realServer) bool { return x.addr == a })
	if i < 0 {
		return nil, 0, syscall.ENOENT
	}
	return vs, i, nil
}

var knownSchedulers = []string{"rr", "wrr", "lc", "wlc", "sh", "dh", "mh", "sed", "nq", "lblc", "lblcr", "fo", "ovf", "twos"}

// NewService implements ipvs.IPVS.
func (f *IPVS) NewService(s *ipvs.Service) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("NewService", s, nil); err != nil {
		return err
	}
	proto, addr, ok := identify(s)
	if !ok {
		return syscall.EINVAL
	}
	k := vsName(proto, addr)
	if f.services[k] != nil {
		return syscall.EEXIST
	}
	if !slices.Contains(knownSchedulers, s.SchedName) {
		return syscall.ENOENT
	}
	c := *s
	c.Address = slices.Clone(s.Address)
	c.Flags &^= flagHashed
	c.Stats = ipvs.ServiceStats{}
	f.services[k] = &virtualServer{proto: proto, addr: addr, svc: c, last: -1, templates: map[netip.Addr]template{}}
	f.order = append(f.order, k)
	return nil
}

// UpdateService implements ipvs.IPVS.
func (f *IPVS) UpdateService(s *ipvs.Service) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	vs, err := f.lookup("UpdateService", s, nil)
	if err != nil {
		return err
	}
	if !slices.Contains(knownSchedulers, s.SchedName) {
		return syscall.ENOENT
	}
	vs.svc.SchedName, vs.svc.Flags, vs.svc.Timeout, vs.svc.Netmask = s.SchedName, s.Flags&^flagHashed, s.Timeout, s.Netmask
	if vs.svc.Flags&flagPersistent == 0 {
		clear(vs.templates)
	}
	return nil
}

// DelService implements ipvs.IPVS.
func (f *IPVS) DelService(s *ipvs.Service) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	vs, err := f.lookup("DelService", s, nil)
	if err != nil {
		return err
	}
	k := vsName(vs.proto, vs.addr)
	delete(f.services, k)
	f.order = slices.DeleteFunc(f.order, func(x string) bool { return x == k })
	return nil
}

// GetServices implements ipvs.IPVS.
func (f *IPVS) GetServices() ([]*ipvs.Service, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("GetServices", nil, nil); err != nil {
		return nil, err
	}
	out := make([]*ipvs.Service, 0, len(f.order))
	for _, k := range f.order {
		c := f.services[k].svc
		c.Address = slices.Clone(c.Address)
		c.Flags |= flagHashed
		out = append(out, &c)
	}
	return out, nil
}

// GetDestinations implements ipvs.IPVS.
func (f *IPVS) GetDestinations(s *ipvs.Service) ([]*ipvs.Destination, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	vs, err := f.lookup("GetDestinations", s, nil)
	if err != nil {
		return nil, err
	}
	out := make([]*ipvs.Destination, 0, len(vs.dests))
	for _, d := range vs.dests {
		x := d.dest
		x.Address = slices.Clone(x.Address)
		x.ActiveConnections, x.InactiveConnections = d.active, d.inactive
		out = append(out, &x)
	}
	return out, nil
}

// NewDestination implements ipvs.IPVS.
func (f *IPVS) NewDestination(s *ipvs.Service, d *ipvs.Destination) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	vs, err := f.lookup("NewDestination", s, d)
	if err != nil {
		return err
	}
	a := destAddr(d)
	if slices.ContainsFunc(vs.dests, func(x *realServer) bool { return x.addr == a }) {
		return syscall.EEXIST
	}
	if !a.IsValid() || a.Addr().Is4() != (vs.svc.AddressFamily == syscall.AF_INET) {
		return syscall.EINVAL
	}
	c := *d
	c.Address = slices.Clone(d.Address)
	c.ActiveConnections, c.InactiveConnections = 0, 0
	vs.dests = append(vs.dests, &realServer{dest: c, addr: a})
	return nil
}

// UpdateDestination implements ipvs.IPVS.
func (f *IPVS) UpdateDestination(s *ipvs.Service, d *ipvs.Destination) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	vs, i, err := f.lookupDest("UpdateDestination", s, d)
	if err != nil {
		return err
	}
	vs.dests[i].dest.Weight = d.Weight
	return nil
}

// DelDestination implements ipvs.IPVS.
func (f *IPVS) DelDestination(s *ipvs.Service, d *ipvs.Destination) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	vs, i, err := f.lookupDest("DelDestination", s, d)
	if err != nil {
		return err
	}
	vs.dests = slices.Delete(vs.dests, i, i+1)
	if vs.last >= i {
		vs.last--
	}
	return nil
}

// GetConfig implements ipvs.IPVS: the timeouts, in whole seconds.
func (f *IPVS) GetConfig() (*ipvs.Timeouts, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("GetConfig"); err != nil {
		return nil, err
	}
	t := f.timeouts
	return &t, nil
}

// Timeouts returns the timeouts GetConfig would, without recording a call.
func (f *IPVS) Timeouts() ipvs.Timeouts {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.timeouts
}

// SetConfig implements ipvs.IPVS as the kernel does: the timeouts are
// truncated to whole seconds, one that is zero is left as it is, and one
// over sysctl.MaxSeconds fails them all with EINVAL.
func (f *IPVS) SetConfig(t *ipvs.Timeouts) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("SetConfig", fmt.Sprintf("tcp=%v tcp_fin=%v udp=%v", t.TimeoutTCP, t.TimeoutTCPFin, t.TimeoutUDP)); err != nil {
		return err
	}
	for _, d := range []time.Duration{t.TimeoutTCP, t.TimeoutTCPFin, t.TimeoutUDP} {
		if d > sysctl.MaxSeconds*time.Second {
			return syscall.EINVAL
		}
	}
	for _, p := range []struct{ from, to *time.Duration }{
		{&t.TimeoutTCP, &f.timeouts.TimeoutTCP},
		{&t.TimeoutTCPFin, &f.timeouts.TimeoutTCPFin},
		{&t.TimeoutUDP, &f.timeouts.TimeoutUDP},
	} {
		if s := p.from.Truncate(time.Second); s > 0 {
			*p.to = s
		}
	}
	return nil
}

// SetConns sets the connection counts of a real server, as if its
// connections had moved through states without Fakes.Connect.
func (f *IPVS) SetConns(proto lb.Protocol, vip, backend netip.AddrPort, active, inactive int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := vsName(proto, vip)
	vs := f.services[k]
	if vs == nil {
		return fmt.Errorf("no virtual server %s", k)
	}
	for _, d := range vs.dests {
		if d.addr == backend {
			d.active, d.inactive = active, inactive
			return nil
		}
	}
	return fmt.Errorf("no real server %v in %s", backend, k)
}

// RealServer is a real server as Services shows it.
type RealServer struct {
	Addr             netip.AddrPort
	Weight           int
	Active, Inactive int
}

// VirtualServer is a virtual server as Services shows it.
type VirtualServer struct {
	Protocol    lb.Protocol
	Addr        netip.AddrPort
	Scheduler   string
	Persistent  bool
	Timeout     uint32 // persistence, seconds
	RealServers []RealServer
}

func (v VirtualServer) String() string {
	s := fmt.Sprintf("%s %v %s", netfilter.ProtoName(v.Protocol), v.Addr, v.Scheduler)
	if v.Persistent {
		s += fmt.Sprintf(" persistent %d", v.Timeout)
	}
	for _, r := range v.RealServers {
		s += fmt.Sprintf(" -> %v w%d", r.Addr, r.Weight)
	}
	return s
}

// Services returns every virtual server, sorted.
func (f *IPVS) Services() []VirtualServer {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]VirtualServer, 0, len(f.services))
	for _, vs := range f.services {
		v := VirtualServer{Protocol: vs.proto, Addr: vs.addr, Scheduler: vs.svc.SchedName,
			Persistent: vs.svc.Flags&flagPersistent != 0, Timeout: vs.svc.Timeout}
		for _, d := range vs.dests {
			v.RealServers = append(v.RealServers, RealServer{d.addr, d.dest.Weight, d.active, d.inactive})
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b VirtualServer) int {
		return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), a.Addr.Compare(b.Addr))
	})
	return out
}

// schedule picks the real server for a new connection from client to the
// virtual server named k, as the kernel would; ok is false when there is no
// virtual server, found is false when it has no real server of weight > 0.
// Callers hold f.mu.
func (f *IPVS) schedule(k string, client netip.Addr) (dest *realServer, found, ok bool) {
	vs := f.services[k]
	if vs == nil {
		return nil, false, false
	}
	live := make([]*realServer, 0, len(vs.dests))
	for _, d := range vs.dests {
		if d.dest.Weight > 0 {
			live = append(live, d)
		}
	}
	if len(live) == 0 {
		return nil, false, true
	}
	now := f.now()
	persistent := vs.svc.Flags&flagPersistent != 0
	if persistent {
		if t, ok := vs.templates[client]; ok && now.Before(t.expires) {
			// expire_quiescent_template: a template to a weight-0 (or
			// deleted) real server is not used.
			if i := slices.IndexFunc(live, func(d *realServer) bool { return d.addr == t.dest }); i >= 0 {
				vs.templates[client] = template{t.dest, now.Add(time.Duration(vs.svc.Timeout) * time.Second)}
				return live[i], true, true
			}
		}
	}
	switch vs.svc.SchedName {
	case "lc", "wlc", "sed", "nq":
		best := live[0]
		for _, d := range live[1:] {
			if (d.active<<8+d.inactive)*best.dest.Weight < (best.active<<8+best.inactive)*d.dest.Weight {
				best = d
			}
		}
		dest = best
	case "sh", "mh", "lblc", "lblcr":
		dest = live[hashOf(client)%uint64(len(live))]
	case "dh":
		dest = live[hashOf(vs.addr.Addr())%uint64(len(live))]
	default: // rr, wrr (svcproxy's weights are all 1), fo, ovf, twos
		n := len(vs.dests)
		for i := 1; i <= n; i++ {
			j := (vs.last + i + n) % n
			if vs.dests[j].dest.Weight > 0 {
				vs.last, dest = j, vs.dests[j]
				break
			}
		}
	}
	if persistent {
		vs.templates[client] = template{dest.addr, now.Add(time.Duration(vs.svc.Timeout) * time.Second)}
	}
	return dest, true, true
}

func hashOf(a netip.Addr) uint64 {
	h := fnv.New64a()
	b := a.As16()
	h.Write(b[:])
	return h.Sum64()
}
