package ipvs

import (
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// FakeIPVS is an in-memory IPVS that behaves as the kernel does for the
// calls Mode makes: the same errors (EEXIST, ESRCH for a missing virtual
// server, ENOENT for a missing real server or unknown scheduler), the
// hashed flag on every listed service, connection counts per real server.
// Fakes.Trace schedules new connections with it: rr and wrr in turn, lc
// and wlc by fewest connections, sh, dh and mh by hashing the source or
// destination address, persistence by client address. It is safe for
// concurrent use.
type FakeIPVS struct {
	mu       sync.Mutex
	services map[vsKey]*fakeVS
	order    []vsKey
	calls    []string
	failing  map[string]error
	now      func() time.Time
}

type fakeVS struct {
	svc       Service
	dests     []*fakeDest
	last      int // rr: index of the last real server chosen
	templates map[netip.Addr]fakeTemplate
}

type fakeDest struct {
	addr             netip.AddrPort
	weight           int
	active, inactive int
}

type fakeTemplate struct {
	dest    netip.AddrPort
	expires time.Time
}

// NewFakeIPVS returns an empty FakeIPVS on clock now (nil: time.Now).
func NewFakeIPVS(now func() time.Time) *FakeIPVS {
	if now == nil {
		now = time.Now
	}
	return &FakeIPVS{services: map[vsKey]*fakeVS{}, failing: map[string]error{}, now: now}
}

var _ IPVS = (*FakeIPVS)(nil)

// FailNext makes the next call of op (a method name, "NewService") fail
// with err, changing nothing.
func (f *FakeIPVS) FailNext(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failing[op] = err
}

// Calls returns the calls so far as "Method proto/addr:port[ dest]".
func (f *FakeIPVS) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// ResetCalls forgets the calls so far.
func (f *FakeIPVS) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = nil
}

func (f *FakeIPVS) record(op string, s *Service, d *Destination) error {
	c := op
	if s != nil {
		k, _, _ := fromService(s)
		c += " " + k.String()
	}
	if d != nil {
		a, _ := destAddr(d)
		c += " " + a.String()
	}
	f.calls = append(f.calls, c)
	if err := f.failing[op]; err != nil {
		delete(f.failing, op)
		return err
	}
	return nil
}

func (f *FakeIPVS) lookup(s *Service) (vsKey, *fakeVS, error) {
	k, _, ok := fromService(s)
	if !ok {
		return k, nil, syscall.EINVAL
	}
	vs := f.services[k]
	if vs == nil {
		return k, nil, syscall.ESRCH
	}
	return k, vs, nil
}

var knownSchedulers = []string{"rr", "wrr", "lc", "wlc", "sh", "dh", "mh", "sed", "nq", "lblc", "lblcr", "fo", "ovf", "twos"}

// NewService implements IPVS.
func (f *FakeIPVS) NewService(s *Service) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("NewService", s, nil); err != nil {
		return err
	}
	k, _, ok := fromService(s)
	if !ok {
		return syscall.EINVAL
	}
	if f.services[k] != nil {
		return syscall.EEXIST
	}
	if !slices.Contains(knownSchedulers, s.SchedName) {
		return syscall.ENOENT
	}
	c := *s
	c.Flags &^= flagHashed
	c.Stats = ServiceStats{}
	f.services[k] = &fakeVS{svc: c, last: -1, templates: map[netip.Addr]fakeTemplate{}}
	f.order = append(f.order, k)
	return nil
}

// UpdateService implements IPVS.
func (f *FakeIPVS) UpdateService(s *Service) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("UpdateService", s, nil); err != nil {
		return err
	}
	_, vs, err := f.lookup(s)
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

// DelService implements IPVS.
func (f *FakeIPVS) DelService(s *Service) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("DelService", s, nil); err != nil {
		return err
	}
	k, _, err := f.lookup(s)
	if err != nil {
		return err
	}
	delete(f.services, k)
	f.order = slices.DeleteFunc(f.order, func(x vsKey) bool { return x == k })
	return nil
}

// GetServices implements IPVS.
func (f *FakeIPVS) GetServices() ([]*Service, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("GetServices", nil, nil); err != nil {
		return nil, err
	}
	out := make([]*Service, 0, len(f.order))
	for _, k := range f.order {
		c := f.services[k].svc
		c.Address = slices.Clone(c.Address)
		c.Flags |= flagHashed
		out = append(out, &c)
	}
	return out, nil
}

// GetDestinations implements IPVS.
func (f *FakeIPVS) GetDestinations(s *Service) ([]*Destination, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("GetDestinations", s, nil); err != nil {
		return nil, err
	}
	_, vs, err := f.lookup(s)
	if err != nil {
		return nil, err
	}
	out := make([]*Destination, 0, len(vs.dests))
	for _, d := range vs.dests {
		x := toDestination(d.addr, d.weight)
		x.ActiveConnections, x.InactiveConnections = d.active, d.inactive
		out = append(out, x)
	}
	return out, nil
}

func (vs *fakeVS) dest(d *Destination) (int, netip.AddrPort) {
	a, _ := destAddr(d)
	return slices.IndexFunc(vs.dests, func(x *fakeDest) bool { return x.addr == a }), a
}

// NewDestination implements IPVS.
func (f *FakeIPVS) NewDestination(s *Service, d *Destination) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("NewDestination", s, d); err != nil {
		return err
	}
	_, vs, err := f.lookup(s)
	if err != nil {
		return err
	}
	i, a := vs.dest(d)
	if i >= 0 {
		return syscall.EEXIST
	}
	if !a.IsValid() || a.Addr().Is4() != (vs.svc.AddressFamily == syscall.AF_INET) {
		return syscall.EINVAL
	}
	vs.dests = append(vs.dests, &fakeDest{addr: a, weight: d.Weight})
	return nil
}

// UpdateDestination implements IPVS.
func (f *FakeIPVS) UpdateDestination(s *Service, d *Destination) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("UpdateDestination", s, d); err != nil {
		return err
	}
	_, vs, err := f.lookup(s)
	if err != nil {
		return err
	}
	i, _ := vs.dest(d)
	if i < 0 {
		return syscall.ENOENT
	}
	vs.dests[i].weight = d.Weight
	return nil
}

// DelDestination implements IPVS.
func (f *FakeIPVS) DelDestination(s *Service, d *Destination) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("DelDestination", s, d); err != nil {
		return err
	}
	_, vs, err := f.lookup(s)
	if err != nil {
		return err
	}
	i, _ := vs.dest(d)
	if i < 0 {
		return syscall.ENOENT
	}
	vs.dests = slices.Delete(vs.dests, i, i+1)
	if vs.last >= i {
		vs.last--
	}
	return nil
}

// SetConns sets the connection counts of a real server, as if its
// connections had moved through states without Fakes.Connect.
func (f *FakeIPVS) SetConns(proto lb.Protocol, vip, backend netip.AddrPort, active, inactive int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	vs := f.services[vsKey{proto, vip}]
	if vs == nil {
		return fmt.Errorf("no virtual server %s/%v", netfilter.ProtoName(proto), vip)
	}
	for _, d := range vs.dests {
		if d.addr == backend {
			d.active, d.inactive = active, inactive
			return nil
		}
	}
	return fmt.Errorf("no real server %v in %s/%v", backend, netfilter.ProtoName(proto), vip)
}

// RealServer is a real server as Dump and Services show it.
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
func (f *FakeIPVS) Services() []VirtualServer {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]VirtualServer, 0, len(f.services))
	for _, k := range slices.SortedFunc(slices.Values(f.order), vsKey.Compare) {
		vs := f.services[k]
		v := VirtualServer{Protocol: k.proto, Addr: k.addr, Scheduler: vs.svc.SchedName,
			Persistent: vs.svc.Flags&flagPersistent != 0, Timeout: vs.svc.Timeout}
		for _, d := range vs.dests {
			v.RealServers = append(v.RealServers, RealServer{d.addr, d.weight, d.active, d.inactive})
		}
		out = append(out, v)
	}
	return out
}

// schedule picks the real server for a new connection from client to the
// virtual server k, as the kernel would; ok is false when there is no
// virtual server, found is false when it has no real server of weight > 0.
// Callers hold f.mu.
func (f *FakeIPVS) schedule(k vsKey, client netip.Addr) (dest *fakeDest, found, ok bool) {
	vs := f.services[k]
	if vs == nil {
		return nil, false, false
	}
	live := make([]*fakeDest, 0, len(vs.dests))
	for _, d := range vs.dests {
		if d.weight > 0 {
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
			if i := slices.IndexFunc(live, func(d *fakeDest) bool { return d.addr == t.dest }); i >= 0 {
				vs.templates[client] = fakeTemplate{t.dest, now.Add(time.Duration(vs.svc.Timeout) * time.Second)}
				return live[i], true, true
			}
		}
	}
	switch vs.svc.SchedName {
	case "lc", "wlc", "sed", "nq":
		best := live[0]
		for _, d := range live[1:] {
			if (d.active<<8+d.inactive)*best.weight < (best.active<<8+best.inactive)*d.weight {
				best = d
			}
		}
		dest = best
	case "sh", "mh", "lblc", "lblcr":
		dest = live[hashOf(client)%uint64(len(live))]
	case "dh":
		dest = live[hashOf(k.addr.Addr())%uint64(len(live))]
	default: // rr, wrr (svcproxy's weights are all 1), fo, ovf, twos
		n := len(vs.dests)
		for i := 1; i <= n; i++ {
			j := (vs.last + i + n) % n
			if vs.dests[j].weight > 0 {
				vs.last, dest = j, vs.dests[j]
				break
			}
		}
	}
	if persistent {
		vs.templates[client] = fakeTemplate{dest.addr, now.Add(time.Duration(vs.svc.Timeout) * time.Second)}
	}
	return dest, true, true
}

func hashOf(a netip.Addr) uint64 {
	h := fnv.New64a()
	b := a.As16()
	h.Write(b[:])
	return h.Sum64()
}
