package main

import (
	"context"
	"net/netip"
	"time"
)

// A Mode is one way of carrying a Service's traffic from the client
// namespace to the backends. Each (round, mode) gets a fresh Cluster, so no
// mode inherits another's rules, conntrack entries or TIME_WAIT sockets.
//
// A new mode (svcproxy's kernel modes, another peer) plugs in by
// implementing Mode, and ControlPlane if it programs Services, and being
// listed in modes.
type Mode interface {
	Name() string
	// Describe says in a line what runs, for results.md.
	Describe() string
	// Available returns nil when the mode can run on this machine, or an
	// errSkip error saying why not: the mode is then reported as skipped
	// with that reason, not as failed.
	Available(e *Env) error
	// Start makes the mode carry every Service port of c.Services, with
	// backends already running, and returns once it is configured (the
	// suite then checks from the client that it serves).
	Start(ctx context.Context, c *Cluster) (*Running, error)
}

// Running is a mode carrying the data-path Services on one Cluster.
type Running struct {
	// Targets is where the client connects for each Service port (by Key):
	// the VIP for every mode but direct.
	Targets map[string]netip.AddrPort
	// PIDs returns the processes whose CPU time and memory are the proxy's;
	// nil when the data path is the kernel's (no process to charge).
	PIDs func() []int
	// Goroutines, where the proxy is a Go program, reads how many
	// goroutines it runs (the idle test reports it: a goroutine per
	// connection would show there).
	Goroutines func() (int, error)
	// Balances tells whether the mode spreads a Service over its endpoints
	// (the fault test needs it).
	Balances bool
	// Notes are facts about this run worth a line in results.md.
	Notes []string
	// Config is the mode's configuration (file, rules), saved with the
	// results as <mode>.conf.
	Config string
	// Stop stops the mode; the Cluster's Close stops anything left.
	Stop func()
}

// ControlPlane is implemented by modes that program Services from a
// description (a Kubernetes Service proxy), not from a hand-written config.
type ControlPlane interface {
	// ProgramServices programs services from scratch on the fresh node
	// namespace node (no traffic), then applies changes (endpoint changes,
	// then Services added) one at a time, each waiting until it is live,
	// and reports how long each took.
	ProgramServices(ctx context.Context, e *Env, c *Cluster, services []SvcPort, changes []EndpointChange) (*CPResult, error)
}

// controlPlaneOf returns m's control plane, if the control-plane test
// measures it: svcproxy on the VIPs is the userspace mode without its
// steering rules, a data-path footing only (its programming is
// svcproxy-userspace's minus the rules the test waits for).
func controlPlaneOf(m Mode) (ControlPlane, bool) {
	if s, ok := m.(svcproxyMode); ok && (s.onVIP || s.local || s.offload != "") { // data-path variants of svcproxy-userspace
		return nil, false
	}
	cp, ok := m.(ControlPlane)
	return cp, ok
}

// EndpointChange replaces one endpoint of one Service port.
type EndpointChange struct {
	Service int            // index into the services slice
	Old     netip.AddrPort // the endpoint removed
	New     netip.AddrPort // the endpoint added in its place
	// Added, when set, makes the change adding this Service port instead,
	// appended to the services slice (Service is its index there).
	Added *SvcPort
}

// CPResult is one control-plane measurement at one scale.
type CPResult struct {
	Services, Endpoints int
	// Program is the mode's own work to program every Service from
	// scratch: for kube-dnat one iptables-restore; for svcproxy from the
	// store publishing the snapshot to the rules being applied.
	Program time.Duration
	// ProgramTotal also counts the source: for svcproxy from process start
	// (reading and parsing the services file) to live; for kube-dnat rule
	// generation plus the restore.
	ProgramTotal time.Duration
	// Changes and ChangesTotal are, per endpoint change, the mode's own
	// work and the end-to-end time, with the same split as Program.
	Changes, ChangesTotal []time.Duration
	// Adds and AddsTotal are the same per Service added.
	Adds, AddsTotal []time.Duration
	Notes           []string
}

// took records one change's times where its kind belongs.
func (r *CPResult) took(ch EndpointChange, own, total time.Duration) {
	if ch.Added != nil {
		r.Adds, r.AddsTotal = append(r.Adds, own), append(r.AddsTotal, total)
		return
	}
	r.Changes, r.ChangesTotal = append(r.Changes, own), append(r.ChangesTotal, total)
}

// apply makes ch in services: an endpoint replaced, or a Service appended.
func (ch EndpointChange) apply(services []SvcPort) []SvcPort {
	if ch.Added != nil {
		return append(services, *ch.Added)
	}
	replaceEndpoint(&services[ch.Service], ch)
	return services
}

// modes is every mode, in the default run order.
var modes = []Mode{
	directMode{},
	svcproxyMode{name: "svcproxy-userspace"},
	svcproxyMode{name: "svcproxy-userspace-ipset", steeringBackend: "iptables"},
	svcproxyMode{name: "svcproxy-vip", onVIP: true},
	svcproxyMode{name: "svcproxy-local", local: true},
	svcproxyMode{name: "svcproxy-sockmap", offload: "sockmap"},
	&kubeDNATMode{},
	kubeDNATMasqMode{&kubeDNATMode{masqueradeAll: true}},
	svcproxyMode{name: "svcproxy-iptables", kernelMode: "iptables"},
	svcproxyMode{name: "svcproxy-nftables", kernelMode: "nftables"},
	svcproxyMode{name: "svcproxy-ipvs", kernelMode: "ipvs"},
	haproxyMode{},
	nginxStreamMode{},
}

func modeNames() []string {
	var out []string
	for _, m := range modes {
		out = append(out, m.Name())
	}
	return out
}

func modeByName(name string) Mode {
	for _, m := range modes {
		if m.Name() == name {
			return m
		}
	}
	return nil
}

// kernelDataPath tells whether m's data path is the kernel's, with no proxy
// process to profile: direct, kube-dnat and svcproxy's kernel modes.
func kernelDataPath(m Mode) bool {
	switch m := m.(type) {
	case directMode, *kubeDNATMode, kubeDNATMasqMode:
		return true
	case svcproxyMode:
		return m.kernelMode != ""
	}
	return false
}

// baselines are the modes ratios are reported against, when they ran.
var baselines = []string{"direct", "kube-dnat", "kube-dnat-masq", "svcproxy-iptables"}

// directMode is the floor: the client talks to backend0 itself, no proxy.
type directMode struct{}

func (directMode) Name() string { return "direct" }
func (directMode) Describe() string {
	return "client to backend0 directly, routed by the node: no proxy, no NAT (the floor)"
}
func (directMode) Available(*Env) error { return nil }
func (directMode) Start(_ context.Context, c *Cluster) (*Running, error) {
	t := map[string]netip.AddrPort{}
	for _, s := range c.Services {
		t[s.Key()] = s.Endpoints[0]
	}
	return &Running{Targets: t, Stop: func() {}}, nil
}

// vipTargets is the Targets of a mode that serves the VIPs.
func vipTargets(services []SvcPort) map[string]netip.AddrPort {
	t := map[string]netip.AddrPort{}
	for _, s := range services {
		t[s.Key()] = s.Frontend()
	}
	return t
}

// addVIPs puts the data-path VIPs on the node's lo, for the peer proxies,
// which listen on them (svcproxy and kube-dnat steer them with rules).
func addVIPs(c *Cluster) error {
	seen := map[netip.Addr]bool{}
	for _, s := range c.Services {
		if seen[s.VIP] {
			continue
		}
		seen[s.VIP] = true
		if err := c.Topo.AddNodeAddress(netip.PrefixFrom(s.VIP, 32)); err != nil {
			return err
		}
	}
	return nil
}

// nodeOnly is the topology of a control-plane cluster: a node, nothing else.
func nodeOnly(e *Env, name string) (*Cluster, error) { return newCluster(e, name, -1, -1) }
