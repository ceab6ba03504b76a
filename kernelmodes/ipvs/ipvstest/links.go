package ipvstest

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/sysctl/sysctltest"
)

// Links is an in-memory ipvs.Links: interfaces with addresses. It starts
// with lo (127.0.0.1, ::1); AddNodeAddr adds the node's own addresses.
type Links struct {
	recorder
	mu    sync.Mutex
	links map[string]*link
}

type link struct {
	kind  string
	addrs []netip.Addr
}

// NewLinks returns a Links holding lo.
func NewLinks() *Links {
	return &Links{
		links: map[string]*link{"lo": {kind: "loopback", addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}}},
	}
}

var _ ipvs.Links = (*Links)(nil)

// AddNodeAddr puts addr on interface name (an Ethernet-like one, created
// when missing), as the node's own address.
func (f *Links) AddNodeAddr(name string, addr netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.links[name]
	if l == nil {
		l = &link{kind: "veth"}
		f.links[name] = l
	}
	if !slices.Contains(l.addrs, addr) {
		l.addrs = append(l.addrs, addr)
	}
}

// Link returns the kind and addresses of an interface; ok is false when it
// does not exist.
func (f *Links) Link(name string) (kind string, addrs []netip.Addr, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.links[name]
	if l == nil {
		return "", nil, false
	}
	return l.kind, slices.Clone(l.addrs), true
}

// EnsureDummy implements ipvs.Links.
func (f *Links) EnsureDummy(ctx context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("EnsureDummy", name); err != nil {
		return err
	}
	if l := f.links[name]; l != nil {
		if l.kind != "dummy" {
			return fmt.Errorf("interface %s exists and is a %s, not a dummy", name, l.kind)
		}
		return nil
	}
	f.links[name] = &link{kind: "dummy"}
	return nil
}

// DeleteLink implements ipvs.Links.
func (f *Links) DeleteLink(ctx context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("DeleteLink", name); err != nil {
		return err
	}
	delete(f.links, name)
	return nil
}

// lookup records op on interface name (with more arguments) and finds
// it: ErrNoLink when it does not exist. Callers hold f.mu.
func (f *Links) lookup(op, name string, more ...any) (*link, error) {
	if err := f.record(op, append([]any{name}, more...)...); err != nil {
		return nil, err
	}
	l := f.links[name]
	if l == nil {
		return nil, fmt.Errorf("%s: %w", name, ipvs.ErrNoLink)
	}
	return l, nil
}

// Addrs implements ipvs.Links.
func (f *Links) Addrs(ctx context.Context, name string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, err := f.lookup("Addrs", name)
	if err != nil {
		return nil, err
	}
	return slices.Clone(l.addrs), nil
}

// AddAddr implements ipvs.Links.
func (f *Links) AddAddr(ctx context.Context, name string, addr netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, err := f.lookup("AddAddr", name, addr)
	if err != nil {
		return err
	}
	if !slices.Contains(l.addrs, addr) {
		l.addrs = append(l.addrs, addr)
	}
	return nil
}

// DelAddr implements ipvs.Links.
func (f *Links) DelAddr(ctx context.Context, name string, addr netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, err := f.lookup("DelAddr", name, addr)
	if err != nil {
		return err
	}
	l.addrs = slices.DeleteFunc(l.addrs, func(a netip.Addr) bool { return a == addr })
	return nil
}

// NodeAddrs implements ipvs.Links.
func (f *Links) NodeAddrs(ctx context.Context, exclude string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("NodeAddrs", exclude); err != nil {
		return nil, err
	}
	var out []netip.Addr
	for name, l := range f.links {
		if name == exclude || l.kind == "loopback" {
			continue
		}
		for _, a := range l.addrs {
			if a.IsGlobalUnicast() && !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// local returns every address of every interface (a down dummy's included:
// the kernel still routes them locally). Callers hold f.mu.
func (f *Links) local() []netip.Addr {
	var out []netip.Addr
	for _, l := range f.links {
		out = append(out, l.addrs...)
	}
	return out
}

// Conntrack is an in-memory ipvs.Conntrack (a conntrack.Table) holding the
// UDP flows Fakes.Connect opened; Delete deletes those its predicate picks.
type Conntrack struct {
	recorder
	mu    sync.Mutex
	flows map[udpFlow]netip.AddrPort // -> backend
}

type udpFlow struct {
	client, vip netip.AddrPort
}

var _ ipvs.Conntrack = (*Conntrack)(nil)

// Delete implements conntrack.Table. Each call is a read of the table,
// recorded as "Delete <family>".
func (f *Conntrack) Delete(ctx context.Context, family netfilter.Family, match func(conntrack.Flow) bool) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.record("Delete", family); err != nil {
		return 0, err
	}
	n := 0
	for k, b := range f.flows {
		fl := conntrack.Flow{Proto: lb.UDP, OrigSrc: k.client, OrigDst: k.vip, ReplySrc: b}
		if netfilter.FamilyOf(k.vip.Addr()) == family && match(fl) {
			delete(f.flows, k)
			n++
		}
	}
	return n, nil
}

// Flows returns the UDP flows as "client -> vip:port -> backend", sorted.
func (f *Conntrack) Flows() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for k, b := range f.flows {
		out = append(out, fmt.Sprintf("%v -> %v -> %v", k.client, k.vip, b))
	}
	slices.Sort(out)
	return out
}

// DefaultSysctls are the parameters the IPVS mode reads, at a fresh
// network namespace's defaults: those the ip_vs module adds, and
// ip_forward.
func DefaultSysctls() map[string]string {
	return map[string]string{
		"net/ipv4/vs/conntrack":                 "0",
		"net/ipv4/vs/expire_nodest_conn":        "0",
		"net/ipv4/vs/expire_quiescent_template": "0",
		"net/ipv4/vs/conn_reuse_mode":           "1",
		"net/ipv4/ip_forward":                   "0",
	}
}

// Sysctls is an in-memory ipvs.Sysctls holding DefaultSysctls
// (sysctltest.Params), with its calls recorded; reading another is an
// error, as a missing file under /proc/sys is.
type Sysctls struct {
	recorder
	p *sysctltest.Params
}

// NewSysctls returns DefaultSysctls.
func NewSysctls() *Sysctls {
	return &Sysctls{p: sysctltest.NewParams(DefaultSysctls())}
}

var _ ipvs.Sysctls = (*Sysctls)(nil)

// Sysctl implements ipvs.Sysctls.
func (f *Sysctls) Sysctl(name string) (string, error) {
	if err := f.record("Sysctl", name); err != nil {
		return "", err
	}
	return f.p.Sysctl(name)
}

// SetSysctl implements ipvs.Sysctls.
func (f *Sysctls) SetSysctl(name, value string) error {
	if err := f.record("SetSysctl", name+"="+value); err != nil {
		return err
	}
	return f.p.SetSysctl(name, value)
}

// Values returns every sysctl.
func (f *Sysctls) Values() map[string]string { return f.p.Values() }
