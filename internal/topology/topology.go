package topology

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
)

// The address plan. Every address a topology uses is in Range.
var (
	// Range holds every IPv4 address of every topology; clients and
	// backends route it (and nothing else) via the node. AddNodeAddress
	// accepts only prefixes inside it (or Range6).
	Range = netip.MustParsePrefix("198.18.0.0/15")
	// NodeAddr is the node's address, on its lo and on every link.
	NodeAddr = netip.MustParseAddr("198.18.0.1")
	// FreeRange is used by no host: Service VIPs and ExternalIPs go here.
	FreeRange = netip.MustParsePrefix("198.19.0.0/16")

	clientNet  = netip.MustParsePrefix("198.18.1.0/24") // client i: .(i+1)
	backendNet = netip.MustParsePrefix("198.18.2.0/24") // backend i: .(i+1)

	// The IPv6 plan, alongside: unique local addresses laid out as the
	// IPv4 ones (fd00:18::/32 for hosts, fd00:19::/32 free).
	Range6     = netip.MustParsePrefix("fd00:18::/31")
	NodeAddr6  = netip.MustParseAddr("fd00:18::1")
	FreeRange6 = netip.MustParsePrefix("fd00:19::/32")

	clientNet6  = netip.MustParsePrefix("fd00:18:1::/64") // client i: ::(i+1)
	backendNet6 = netip.MustParsePrefix("fd00:18:2::/64") // backend i: ::(i+1)
)

const (
	// DefaultPrefix is the namespace name prefix when Options.Prefix is empty.
	DefaultPrefix = "svcproxy-"
	// MaxClients and MaxBackends are what the address plan has room for.
	MaxClients  = 254
	MaxBackends = 254
	// HostLink is the name of every client's and backend's link to the node,
	// inside its own namespace.
	HostLink = "eth0"

	netnsDir = "/var/run/netns" // where `ip netns` keeps its names
)

// Options configures New. Zero values mean the stated defaults.
type Options struct {
	// Prefix starts every namespace name; "<pid>-<6 hex digits>-<role>"
	// follows. Letters, digits, '.', '_' and '-' only, at most 64 bytes.
	// Empty: DefaultPrefix ("svcproxy-").
	Prefix string
	// Backends is the number of backend namespaces. Zero: 2; negative: none;
	// at most MaxBackends.
	Backends int
	// Clients is the number of client namespaces. Zero: 1; negative: none;
	// at most MaxClients.
	Clients int
	// NoSignalCleanup, if true, keeps New from installing its SIGINT/SIGTERM/
	// SIGHUP handler (which closes every topology made without this option
	// and then lets the signal end the process). Set it in a program that
	// handles signals itself and calls Close.
	NoSignalCleanup bool
}

var prefixRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

func (o Options) withDefaults() (Options, error) {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if !prefixRE.MatchString(o.Prefix) {
		return o, fmt.Errorf("topology: prefix %q: want 1 to 64 letters, digits, '.', '_' or '-'", o.Prefix)
	}
	var err error
	if o.Clients, err = count("clients", o.Clients, 1, MaxClients); err != nil {
		return o, err
	}
	if o.Backends, err = count("backends", o.Backends, 2, MaxBackends); err != nil {
		return o, err
	}
	return o, nil
}

func count(what string, n, def, max int) (int, error) {
	switch {
	case n == 0:
		return def, nil
	case n < 0:
		return 0, nil
	case n > max:
		return 0, fmt.Errorf("topology: %d %s: the address plan has room for %d", n, what, max)
	}
	return n, nil
}

// Host is one namespace of a topology.
type Host struct {
	Name     string     // role: "node", "client0", "backend0", ...
	NS       string     // namespace name, as `ip netns` knows it
	Addr     netip.Addr // its address on its link(s) to the node
	Addr6    netip.Addr // its IPv6 address, likewise
	NodeLink string     // the node-side veth of its link ("c0", "b1"); empty for the node
}

// Topology is a node namespace with its client and backend namespaces.
// Its methods are safe for concurrent use.
type Topology struct {
	Node     *Host
	Clients  []*Host
	Backends []*Host

	signals bool // closed by the signal handler

	mu     sync.Mutex
	closed bool
	made   []string // namespaces that may exist, in creation order
}

// testHookStep, if set, runs after each step of New; an error fails New there.
var testHookStep func(step string) error

// New builds a topology. It needs root and `ip`; errors wrap ErrUnsupported
// when those are missing or the kernel refuses namespaces or veth pairs.
// When New fails, it has deleted every namespace it made.
func New(opts Options) (*Topology, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := supported(); err != nil {
		return nil, err
	}
	t := plan(o, fmt.Sprintf("%s%d-%06x", o.Prefix, os.Getpid(), rand.Uint32()&0xffffff))
	register(t)
	if err := t.build(); err != nil {
		if cerr := t.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("topology: cleaning up after failed New: %w", cerr))
		}
		return nil, err
	}
	return t, nil
}

func supported() error {
	if runtime.GOOS != "linux" {
		return fmt.Errorf("topology: %w: network namespaces are Linux-only", ErrUnsupported)
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("topology: %w: needs root (euid %d)", ErrUnsupported, os.Geteuid())
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("topology: %w: needs the iproute2 ip command: %v", ErrUnsupported, err)
	}
	if _, err := os.Stat("/proc/thread-self/ns/net"); err != nil {
		return fmt.Errorf("topology: %w: %v", ErrUnsupported, err)
	}
	return nil
}

// plan names and addresses every host; it makes nothing.
func plan(o Options, base string) *Topology {
	t := &Topology{
		Node:    &Host{Name: "node", NS: base + "-node", Addr: NodeAddr, Addr6: NodeAddr6},
		signals: !o.NoSignalCleanup,
	}
	host := func(role string, i int, subnet, subnet6 netip.Prefix, link string) *Host {
		a, a6 := subnet.Addr().As4(), subnet6.Addr().As16()
		a[3], a6[15] = byte(i+1), byte(i+1)
		name := fmt.Sprintf("%s%d", role, i)
		return &Host{Name: name, NS: base + "-" + name, Addr: netip.AddrFrom4(a), Addr6: netip.AddrFrom16(a6), NodeLink: fmt.Sprintf("%s%d", link, i)}
	}
	for i := range o.Clients {
		t.Clients = append(t.Clients, host("client", i, clientNet, clientNet6, "c"))
	}
	for i := range o.Backends {
		t.Backends = append(t.Backends, host("backend", i, backendNet, backendNet6, "b"))
	}
	return t
}

// Hosts returns the node, then the clients, then the backends.
func (t *Topology) Hosts() []*Host {
	return slices.Concat([]*Host{t.Node}, t.Clients, t.Backends)
}

func (t *Topology) build() error {
	hosts := t.Hosts()
	// Namespaces first, all in one `ip -batch`; each is recorded before it
	// can exist, so Close (also from the signal handler) finds it.
	var b strings.Builder
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return errors.New("topology: closed while being built")
	}
	for _, h := range hosts {
		t.made = append(t.made, h.NS)
		fmt.Fprintf(&b, "netns add %s\n", h.NS)
	}
	err := ipBatch("", b.String())
	t.mu.Unlock()
	if err != nil {
		return fmt.Errorf("topology: creating namespaces: %w", err)
	}
	if err := step("namespaces"); err != nil {
		return err
	}
	// No duplicate address detection on the links to come: until it ends,
	// a link's IPv6 link-local address is unusable, and the node needs it
	// to find a host's link address for traffic it forwards.
	for _, h := range hosts {
		if err := h.Do(noDAD); err != nil {
			return fmt.Errorf("topology: turning off IPv6 duplicate address detection in %s: %w", h.NS, err)
		}
	}

	// The node: lo, its addresses, and one veth pair per host, created from
	// inside the node with the peer put straight into the host's namespace.
	// IPv6 has no peer addresses: each host gets a route instead.
	b.Reset()
	fmt.Fprintf(&b, "link set lo up\naddr add %s/32 dev lo\naddr add %s/128 dev lo nodad\n", NodeAddr, NodeAddr6)
	for _, h := range hosts[1:] {
		fmt.Fprintf(&b, "link add %s type veth peer name %s netns %s\n", h.NodeLink, HostLink, h.NS)
		fmt.Fprintf(&b, "addr add %s/32 peer %s/32 dev %s\n", NodeAddr, h.Addr, h.NodeLink)
		fmt.Fprintf(&b, "addr add %s/128 dev %s nodad\n", NodeAddr6, h.NodeLink)
		fmt.Fprintf(&b, "link set %s up\n", h.NodeLink)
		fmt.Fprintf(&b, "route add %s/128 dev %s\n", h.Addr6, h.NodeLink)
	}
	if err := ipBatch(t.Node.NS, b.String()); err != nil {
		return fmt.Errorf("topology: setting up %s: %w", t.Node.NS, err)
	}
	if err := t.Node.Do(func() error {
		return errors.Join(setSysctl("net/ipv4/ip_forward", "1"), setSysctl("net/ipv6/conf/all/forwarding", "1"))
	}); err != nil {
		return fmt.Errorf("topology: enabling forwarding in %s: %w", t.Node.NS, err)
	}
	if err := step("node"); err != nil {
		return err
	}

	for _, h := range hosts[1:] {
		b.Reset()
		fmt.Fprintf(&b, "link set lo up\n")
		fmt.Fprintf(&b, "addr add %s/32 peer %s/32 dev %s\n", h.Addr, NodeAddr, HostLink)
		fmt.Fprintf(&b, "addr add %s/128 dev %s nodad\n", h.Addr6, HostLink)
		fmt.Fprintf(&b, "link set %s up\n", HostLink)
		fmt.Fprintf(&b, "route add %s via %s dev %s src %s\n", Range, NodeAddr, HostLink, h.Addr)
		fmt.Fprintf(&b, "route add %s/128 dev %s\n", NodeAddr6, HostLink)
		fmt.Fprintf(&b, "route add %s via %s dev %s src %s\n", Range6, NodeAddr6, HostLink, h.Addr6)
		if err := ipBatch(h.NS, b.String()); err != nil {
			return fmt.Errorf("topology: setting up %s: %w", h.NS, err)
		}
		if err := step(h.Name); err != nil {
			return err
		}
	}
	return nil
}

func step(name string) error {
	if testHookStep == nil {
		return nil
	}
	return testHookStep(name)
}

// noDAD turns IPv6 duplicate address detection off for the links the
// calling thread's namespace gets from now on; call it inside Do.
func noDAD() error {
	return errors.Join(setSysctl("net/ipv6/conf/all/accept_dad", "0"), setSysctl("net/ipv6/conf/default/accept_dad", "0"))
}

// setSysctl writes a net.* sysctl of the calling thread's namespace and
// reads it back; call it inside Do.
func setSysctl(name, value string) error {
	p := "/proc/sys/" + name
	if err := os.WriteFile(p, []byte(value+"\n"), 0o644); err != nil {
		return err
	}
	got, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if s := strings.TrimSpace(string(got)); s != value {
		return fmt.Errorf("%s is %q after writing %q", p, s, value)
	}
	return nil
}

// AddNodeAddress adds prefix (e.g. an ExternalIP, 198.19.0.5/32 or
// fd00:19::5/128) to the node's lo. Every host reaches it through the node.
// It must lie inside Range (Range6) and contain no host's address;
// FreeRange (FreeRange6) is the place for it. As with any address on lo,
// every address of a wider prefix is the node's.
func (t *Topology) AddNodeAddress(prefix netip.Prefix) error {
	within := Range
	if prefix.Addr().Is6() {
		within = Range6
	}
	if !prefix.IsValid() || !within.Contains(prefix.Addr()) || prefix.Bits() < within.Bits() {
		return fmt.Errorf("topology: node address %s: must lie inside %s or %s", prefix, Range, Range6)
	}
	for _, h := range t.Hosts() {
		for _, a := range []netip.Addr{h.Addr, h.Addr6} {
			if prefix.Contains(a) {
				return fmt.Errorf("topology: node address %s: contains %s's address %s", prefix, h.Name, a)
			}
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return fmt.Errorf("topology: node address %s: topology closed", prefix)
	}
	// nodad: a new IPv6 address is tentative (binding it fails) until the
	// kernel's duplicate-address work runs, even on lo where DAD is off;
	// under load that can come after the caller binds.
	nodad := ""
	if prefix.Addr().Is6() {
		nodad = " nodad"
	}
	if err := ipBatch(t.Node.NS, fmt.Sprintf("addr add %s dev lo%s\n", prefix, nodad)); err != nil {
		return fmt.Errorf("topology: adding node address %s: %w", prefix, err)
	}
	return nil
}

// Close kills any process still inside the topology's namespaces and deletes
// them. It is idempotent; after an error, calling it again retries what is
// left.
func (t *Topology) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	var err error
	if len(t.made) > 0 {
		t.made, err = deleteNamespaces(t.made)
	}
	if len(t.made) == 0 {
		unregister(t) // only now: the signal handler must not skip a Close in progress
	}
	return err
}

// deleteNamespaces kills the processes inside each namespace that exists and
// deletes it. It returns those that still exist.
func deleteNamespaces(names []string) ([]string, error) {
	var errs []error
	var b strings.Builder
	var todo []string
	for _, ns := range names {
		if _, err := os.Lstat(netnsPath(ns)); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := killProcesses(ns); err != nil {
			errs = append(errs, fmt.Errorf("topology: killing processes in %s: %w", ns, err))
		}
		todo = append(todo, ns)
		fmt.Fprintf(&b, "netns del %s\n", ns)
	}
	if len(todo) == 0 {
		return nil, errors.Join(errs...)
	}
	if err := ipBatch("", b.String(), "-force"); err != nil {
		errs = append(errs, fmt.Errorf("topology: deleting namespaces: %w", err))
	}
	var left []string
	for _, ns := range todo {
		if _, err := os.Lstat(netnsPath(ns)); !errors.Is(err, os.ErrNotExist) {
			left = append(left, ns)
		}
	}
	if len(left) > 0 {
		errs = append(errs, fmt.Errorf("topology: namespaces left: %s", strings.Join(left, " ")))
	}
	return left, errors.Join(errs...)
}

func netnsPath(ns string) string { return netnsDir + "/" + ns }
