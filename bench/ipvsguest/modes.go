package main

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/bench/internal/vmwire"
	"github.com/svcproxy/svcproxy/forwarder"
	"github.com/svcproxy/svcproxy/kernelmodes/iptables"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/redirect"
	usermode "github.com/svcproxy/svcproxy/userspace"
)

// proxy is one of svcproxy's data paths, driven the way svcproxy's sync
// runner drives it: Apply a snapshot (full the first time), Cleanup at the
// end. A proxy is used once.
type proxy interface {
	Apply(ctx context.Context, snap *lb.Snapshot, full bool) error
	Cleanup(ctx context.Context) error
}

// kernelTools are what the modes share: the IPVS handle (moby/ipvs looks
// the netlink family up once per process) and the logger.
type kernelTools struct {
	ipvs  ipvs.IPVS
	links *ipvs.NetlinkLinks
	log   *zap.Logger
	// calls times the IPVS mode's kernel calls.
	calls timer
}

// describe says in a line what each mode runs in the VM.
func describe(mode string) string {
	switch mode {
	case vmwire.ModeDirect:
		return "the pod to backend0 directly, routed by the node: no proxy, no NAT (the VM's floor)"
	case vmwire.ModeUserspace:
		return "svcproxy's forwarder (2 workers) with REDIRECT steering over ipsets (package redirect), iptables-legacy, driven in the guest"
	case vmwire.ModeIPTables:
		return "svcproxy's iptables DNAT mode (package kernelmodes/iptables), iptables-legacy, driven in the guest"
	case vmwire.ModeIPVS:
		return "svcproxy's IPVS mode (package kernelmodes/ipvs: moby/ipvs netlink, the dummy interface, ipsets and fixed iptables-legacy rules), driven in the guest"
	}
	return mode
}

// newProxy makes a fresh instance of mode; direct has none.
func (k *kernelTools) newProxy(ctx context.Context, mode string) (proxy, []string, error) {
	legacy := &netfilter.Exec{Variant: "legacy"}
	switch mode {
	case vmwire.ModeDirect:
		return nil, nil, nil
	case vmwire.ModeIPVS:
		m, err := ipvs.New(ipvs.Config{
			IPVS:   timedIPVS{k.ipvs, &k.calls},
			Links:  timedLinks{k.links, &k.calls},
			Rules:  timedRules{legacy, &k.calls},
			Logger: k.log,
		})
		return m, []string{"scheduler rr, ClusterIP not masqueraded (svcproxy's defaults)"}, err
	case vmwire.ModeIPTables:
		m, err := iptables.New(iptables.Config{Exec: legacy, Logger: k.log})
		if err != nil {
			return nil, nil, err
		}
		if err := m.Available(ctx); err != nil {
			return nil, nil, err
		}
		return m, []string{"iptables backend " + m.Backend()}, nil
	case vmwire.ModeUserspace:
		return newUserspace(legacy, k.log)
	}
	return nil, nil, fmt.Errorf("unknown mode %q", mode)
}

// userspace is the userspace mode with REDIRECT steering, as cmd/svcproxy
// runs it (--steering=redirect, --redirect-port 15001), and the registry
// of its forwarder's metrics.
type userspace struct {
	*usermode.Mode
	reg *prometheus.Registry
}

const redirectPort = 15001

// vmDialTimeouts are the forwarder's backend connect timeouts in the VM:
// its defaults (250 ms, 500 ms, 1 s, 2 s) are for real CPUs.
var vmDialTimeouts = []time.Duration{2500 * time.Millisecond, 5 * time.Second}

func newUserspace(exec netfilter.Executor, log *zap.Logger) (*userspace, []string, error) {
	reg := prometheus.NewRegistry()
	m, err := usermode.New(usermode.Config{
		Forwarder: forwarder.Config{
			Workers:      2,
			DrainTimeout: time.Second,
			Mark:         forwarder.DefaultMark,
			DialTimeouts: vmDialTimeouts,
			Logger:       log,
			Metrics:      forwarder.NewMetrics(reg),
		},
		// iptables (legacy, exec) + ipset, as the VM's figures say; not
		// auto, which would pick nftables where the guest kernel takes it.
		Steering:     &redirect.Config{Backend: redirect.BackendIPTables, Mark: forwarder.DefaultMark, Exec: exec, Logger: log},
		RedirectPort: redirectPort,
		Logger:       log,
	})
	if err != nil {
		return nil, nil, err
	}
	return &userspace{Mode: m, reg: reg}, []string{"steering with " + m.Steering().Describe(),
		"backend connect timeouts 2.5 s, then 5 s: 10× svcproxy's 250 ms and 500 ms, since on the emulated CPU a loaded veth connect often takes longer than 250 ms (with the defaults about a third of the attempts timed out and were retried)"}, nil
}

// counters says what the forwarder counted: connections by result, dial
// attempts by result, retries.
func (u *userspace) counters() string {
	fams, err := u.reg.Gather()
	if err != nil {
		return "reading the forwarder's metrics: " + err.Error()
	}
	var parts []string
	for _, f := range fams {
		name, ok := strings.CutPrefix(f.GetName(), "svcproxy_forwarder_")
		if !ok || f.GetType() != dto.MetricType_COUNTER || !slices.Contains([]string{"connections_total", "dial_attempts_total", "dial_retries_total"}, name) {
			continue
		}
		for _, m := range f.GetMetric() {
			v := m.GetCounter().GetValue()
			if v == 0 {
				continue
			}
			var labels []string
			for _, l := range m.GetLabel() {
				if l.GetName() != "protocol" {
					labels = append(labels, l.GetValue())
				}
			}
			parts = append(parts, fmt.Sprintf("%s %s %.0f", strings.TrimSuffix(name, "_total"), strings.Join(labels, ","), v))
		}
	}
	return "forwarder counted: " + strings.Join(parts, ", ")
}

// Cleanup shuts the forwarder down and removes the steering rules.
func (u *userspace) Cleanup(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return u.Close(sctx, false)
}

// dataService is the data path's Service: the ClusterIP over the three
// backends.
func dataService() lb.Service {
	s := lb.Service{
		Name:       lb.ServicePortName{Namespace: "bench", Name: "web", Port: "http"},
		Protocol:   lb.TCP,
		Port:       serviceVIP.Port(),
		ClusterIPs: []netip.Addr{serviceVIP.Addr()},
	}
	for _, ip := range backendIPs {
		s.Endpoints = append(s.Endpoints, lb.Endpoint{Addr: netip.AddrPortFrom(ip, backendPort), Ready: true, Serving: true})
	}
	return s
}

func addr4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// genServices makes n Services, each a ClusterIP in 198.19.0.0/16 on port
// 80 with eps endpoints in 198.18.64.0/18 (addresses no host has: the
// control-plane test sends no traffic), as the bench does on the host.
func genServices(n, eps int) []lb.Service {
	vip0 := uint32(198)<<24 | uint32(19)<<16
	ep0 := uint32(198)<<24 | uint32(18)<<16 | uint32(64)<<8
	out := make([]lb.Service, n)
	for i := range out {
		s := lb.Service{
			Name:       lb.ServicePortName{Namespace: "scale", Name: fmt.Sprintf("svc-%05d", i), Port: "http"},
			Protocol:   lb.TCP,
			Port:       80,
			ClusterIPs: []netip.Addr{addr4(vip0 + uint32(i) + 1)},
		}
		for j := range eps {
			k := uint32(i*eps+j) % 16000
			s.Endpoints = append(s.Endpoints, lb.Endpoint{Addr: netip.AddrPortFrom(addr4(ep0+k+1), 8080), Ready: true, Serving: true})
		}
		out[i] = s
	}
	return out
}

// change replaces endpoint m%eps of Service (m*7919+13)%n with a new
// address in 198.18.128.0/17, as the bench's genChanges does; applied in
// order the changes are consistent.
func change(services []lb.Service, m int) lb.Service {
	i := (m*7919 + 13) % len(services)
	s := services[i]
	eps := append([]lb.Endpoint(nil), s.Endpoints...)
	j := m % len(eps)
	new0 := uint32(198)<<24 | uint32(18)<<16 | uint32(128)<<8
	eps[j].Addr = netip.AddrPortFrom(addr4(new0+uint32(m)+1), 8080)
	s.Endpoints = eps
	services[i] = s
	return s
}
