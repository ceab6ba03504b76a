package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netns"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/connlog"
	"github.com/svcproxy/svcproxy/daemon"
	"github.com/svcproxy/svcproxy/forwarder"
	"github.com/svcproxy/svcproxy/iface"
	"github.com/svcproxy/svcproxy/kernelmodes/iptables"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/kernelmodes/nftables"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/proxymode"
	"github.com/svcproxy/svcproxy/redirect"
	"github.com/svcproxy/svcproxy/userspace"
)

// modes is the table of proxy modes, configured from o. The constructors
// read o when called: o.ipv6 is decided once the mode is chosen. Each mode
// built to run exports its repair and iptables-restore failure counts to
// reg, the latter per family it programs.
func modes(o *options, reg prometheus.Registerer, log *zap.Logger, clog *connlog.Log) proxymode.Table {
	ipt := kernelEntry("iptables", o, reg, func() (*iptables.Mode, error) { return iptables.New(iptablesConfig(o, log)) },
		func(m *iptables.Mode) { log.Info("kernel DNAT mode", zap.String("iptables", m.Backend())) })
	nft := kernelEntry("nftables", o, reg, func() (*nftables.Mode, error) { return nftables.New(nftablesConfig(o, log)) }, nil)
	t := proxymode.Table{
		proxymode.Userspace: {
			New: func(ctx context.Context, inherited map[string]*os.File) (proxymode.Mode, error) {
				return newUserspace(ctx, o, reg, log, clog, inherited)
			},
			Probe: func(ctx context.Context) error {
				if o.steering == "local" {
					return userspace.LocalAvailable()
				}
				return userspace.Available(ctx, steeringConfig(o, log))
			},
			Cleanup: func(ctx context.Context) error {
				return errors.Join(userspace.CleanupLocal(ctx, log), userspace.CleanupSteering(ctx, log))
			},
		},
		proxymode.IPTables: linuxOnly(ipt, "the iptables mode"),
		proxymode.IPVS:     kernelEntry("ipvs", o, reg, func() (*ipvs.Mode, error) { return ipvs.New(ipvsConfig(o, log)) }, nil),
		proxymode.NFTables: linuxOnly(nft, "the nftables mode"),
	}
	if _, err := exec.LookPath("iptables-restore"); err != nil {
		for name, e := range t {
			switch name {
			case proxymode.NFTables:
				continue // its tables are made over netlink, without iptables-restore
			case proxymode.Userspace:
				// The nftables steering backend needs no iptables-restore
				// either: its tables are removed where nftables works.
				e.Cleanup = func(ctx context.Context) error {
					err := userspace.CleanupLocal(ctx, log)
					if _, nerr := redirect.Available(ctx, redirect.Config{Backend: redirect.BackendNFTables}); nerr != nil {
						return err // neither steering backend can have installed anything
					}
					return errors.Join(err, userspace.CleanupSteering(ctx, log))
				}
			default:
				e.Cleanup = nil // no mode can have installed anything
			}
			t[name] = e
		}
	}
	return t
}

// linuxOnly is e, whose probe first checks that this system runs what, a
// Linux-only kernel mode.
func linuxOnly(e proxymode.Entry, what string) proxymode.Entry {
	probe := e.Probe
	e.Probe = func(ctx context.Context) error {
		if err := proxymode.LinuxOnly(what); err != nil {
			return err
		}
		return probe(ctx)
	}
	return e
}

// kernelMode is a mode whose rules the kernel runs by itself.
type kernelMode interface {
	proxymode.Mode
	Repairs() uint64
	RestoreFailures(family netfilter.Family) uint64
	ConntrackDeleted(family netfilter.Family) uint64
}

// kernelEntry is the entry of the kernel mode name, which build makes
// without touching the kernel: built to run, started (if set) is called
// with it and its repair and failure counts (iptables-restore runs; the
// nftables mode's transactions) and the conntrack entries it deleted are
// exported to reg, the latter two per family it programs.
func kernelEntry[M kernelMode](name string, o *options, reg prometheus.Registerer, build func() (M, error), started func(M)) proxymode.Entry {
	e := proxymode.Built(func(context.Context) (proxymode.Mode, error) { return build() })
	e.New = func(context.Context, map[string]*os.File) (proxymode.Mode, error) {
		m, err := build()
		if err != nil {
			return nil, err
		}
		if started != nil {
			started(m)
		}
		if name == "nftables" { // transactions over netlink, as kube-proxy's nftables mode names them
			daemon.RegisterNFTablesSyncFailures(reg, daemon.Families(o.ipv6), m.RestoreFailures)
		} else {
			daemon.RegisterRestoreFailures(reg, daemon.Families(o.ipv6), m.RestoreFailures)
		}
		daemon.RegisterRepairs(reg, name, "Full syncs that found the "+name+" mode's rules tampered with and repaired them.", m.Repairs)
		if u, ok := any(m).(interface{ UnservedCleared() uint64 }); ok { // not IPVS: its Service IPs are local
			daemon.RegisterUnservedCleared(reg, u.UnservedCleared)
		}
		daemon.RegisterConntrackDeleted(reg, daemon.Families(o.ipv6), m.ConntrackDeleted)
		return m, nil
	}
	return e
}

func newUserspace(ctx context.Context, o *options, reg prometheus.Registerer, log *zap.Logger, clog *connlog.Log, inherited map[string]*os.File) (*userspace.Mode, error) {
	cfg := userspace.Config{
		Forwarder: forwarder.Config{
			Workers:            o.workers,
			DialTimeouts:       o.dialTimeouts,
			IdleTimeout:        o.idleTimeout,
			DrainTimeout:       o.drainTimeout,
			Mark:               o.mark,
			MaxConns:           o.maxConns,
			MaxConnsPerService: o.maxConnsPerService,
			UDPReceiveBuffer:   o.udpReceiveBuffer,
			IPv6:               o.ipv6,
			Offload:            o.offload,
			IOUring:            o.ioUring,
			Unbalanced:         o.workerBalance == "off",
			Logger:             log,
			ConnLog:            clog,
			UDPIdleTimeout:     o.udpIdleTimeout,
			Metrics:            forwarder.NewMetrics(reg),
			Inherited:          inherited,
			Inside:             insideCluster(ctx, o.clusterCIDRs, log),
		},
		RedirectPort: o.redirectPort,
		Logger:       log,
	}
	cfg.Steering = steeringConfig(o, log)
	// Switching steering leaves nothing of the other behind: REDIRECT
	// rules would take the virtual IPs' connections to a port nobody
	// listens on, and virtual IPs left on the device would answer for
	// Services that are gone. (Connections open across such a switch
	// end with it.)
	// A node without the tools REDIRECT steering is written with cannot
	// hold its rules: local steering starts there. Any other failure to
	// remove them stops it, as they would take its traffic. Without
	// steering, a device a killed local run left is removed when possible
	// (it needs CAP_NET_ADMIN, which --steering=none does not).
	switch o.steering {
	case "local":
		cfg.LocalVIPs = &userspace.LocalVIPs{IPv6: o.ipv6}
		if err := userspace.CleanupSteering(ctx, log); err != nil && !errors.Is(err, exec.ErrNotFound) {
			return nil, fmt.Errorf("removing REDIRECT steering left by an earlier run: %w", err)
		}
	case "redirect":
		if err := userspace.CleanupLocal(ctx, log); err != nil {
			return nil, fmt.Errorf("removing local steering left by an earlier run: %w", err)
		}
	default:
		if err := userspace.CleanupLocal(ctx, log); err != nil {
			log.Warn("cannot remove local steering's device left by an earlier run", zap.String("device", userspace.DefaultVIPDevice), zap.Error(err))
		}
	}
	m, err := userspace.New(cfg)
	if err != nil {
		return nil, err
	}
	if o.steering != "redirect" && (len(o.nodePortAddresses) > 0 || o.nodePortPrimary) {
		log.Warn("--nodeport-addresses is not applied with --steering=" + o.steering + ": the forwarder listens on each NodePort at every address of the node")
	}
	if o.steering == "local" {
		registerLocalSteering(reg, m)
		log.Info("local steering: the virtual IPs on dummy interface "+userspace.DefaultVIPDevice+", the forwarder listening on each frontend", zap.String("device", userspace.DefaultVIPDevice))
	}
	if red := m.Steering(); red != nil {
		o.steeredBy = red.Backend()
		registerSteering(reg, daemon.Families(o.ipv6), red)
		fields := []zap.Field{zap.String("backend", string(red.Backend())), zap.Uint16("redirectPort", o.redirectPort)}
		if ipt := red.IPTables(); ipt != "" && red.Backend() == redirect.BackendIPTables {
			fields = append(fields, zap.String("iptables", ipt))
		}
		log.Info("steering with "+red.Describe(), fields...)
	}
	return m, nil
}

// insideCluster is the forwarder's test of a client inside the cluster
// (forwarder.Config.Inside), for the short circuit of externalTrafficPolicy
// Local: a pod (within cidrs, --cluster-cidr) or the node itself (one of
// its addresses, watched until ctx ends). Where the node's addresses
// cannot be watched, only loopback counts as the node, and it says so.
func insideCluster(ctx context.Context, cidrs []netip.Prefix, log *zap.Logger) func(netip.Addr) bool {
	local, err := iface.WatchLocalAddrs(ctx, netns.None(), func(err error) {
		log.Warn("watching the node's addresses (for externalTrafficPolicy Local's short circuit)", zap.Error(err))
	})
	if err != nil {
		log.Warn("cannot watch the node's addresses: the node's own connections to the external addresses of a Service with externalTrafficPolicy Local get this node's endpoints only", zap.Error(err))
	}
	return func(a netip.Addr) bool {
		for _, p := range cidrs {
			if p.Contains(a) {
				return true
			}
		}
		if local != nil {
			return local.Has(a)
		}
		return a.IsLoopback()
	}
}

// registerLocalSteering exports local steering's device: the virtual IPs
// on it, and the addresses that could not be added or removed (each
// logged; a frontend whose address is missing is not served).
func registerLocalSteering(reg prometheus.Registerer, m *userspace.Mode) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "svcproxy", Subsystem: "local_steering", Name: "addresses",
			Help: "Virtual IPs on local steering's dummy interface (" + userspace.DefaultVIPDevice + ").",
		}, func() float64 { n, _ := m.LocalVIPs(); return float64(n) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "svcproxy", Subsystem: "local_steering", Name: "address_failures_total",
			Help: "Times a virtual IP could not be added to or removed from local steering's dummy interface (each retried on the next sync).",
		}, func() float64 { _, f := m.LocalVIPs(); return float64(f) }))
}

// registerSteering exports red's repair count, the conntrack entries it
// deleted, and its failed writes per family, named as kube-proxy names them
// for the backend that writes the rules: the nftables backend's
// transactions as kubeproxy_sync_proxy_rules_nftables_sync_failures_total
// (as the nftables mode's), the iptables backend's iptables-restore runs as
// kubeproxy_sync_proxy_rules_iptables_restore_failures_total.
func registerSteering(reg prometheus.Registerer, families []string, red *redirect.Redirector) {
	daemon.RegisterRepairs(reg, "redirect", "Full syncs that found svcproxy's rules or sets tampered with and repaired them.", red.Repairs)
	daemon.RegisterUnservedCleared(reg, red.UnservedCleared)
	daemon.RegisterConntrackDeleted(reg, families, red.ConntrackDeleted)
	if red.Backend() == redirect.BackendNFTables {
		daemon.RegisterNFTablesSyncFailures(reg, families, red.SyncFailures)
	} else {
		daemon.RegisterRestoreFailures(reg, families, red.RestoreFailures)
	}
}

// steeringConfig is the userspace mode's steering, nil without
// --steering=redirect.
func steeringConfig(o *options, log *zap.Logger) *redirect.Config {
	if o.steering != "redirect" {
		return nil
	}
	rc := redirectConfig(o, log)
	return &rc
}

func redirectConfig(o *options, log *zap.Logger) redirect.Config {
	return redirect.Config{Backend: o.steeringBackend, Mark: uint32(o.mark), NodePortAddresses: o.nodePortAddresses, IPv6: o.ipv6, NodeIPs: o.steerTo, ClusterCIDRs: o.clusterCIDRs, Logger: log}
}

func iptablesConfig(o *options, log *zap.Logger) iptables.Config {
	return iptables.Config{
		NodePortAddresses: o.nodePortAddresses,
		ClusterCIDRs:      o.clusterCIDRs,
		MasqueradeAll:     o.masqueradeAll,
		Mark:              o.masqueradeMark,
		AvoidMark:         uint32(max(o.mark, 0)),
		IPv6:              o.ipv6,
		Logger:            log,
	}
}

func nftablesConfig(o *options, log *zap.Logger) nftables.Config {
	return nftables.Config{
		NodePortAddresses: o.nodePortAddresses,
		ClusterCIDRs:      o.clusterCIDRs,
		MasqueradeAll:     o.masqueradeAll,
		Mark:              o.masqueradeMark,
		AvoidMark:         uint32(max(o.mark, 0)),
		IPv6:              o.ipv6,
		Logger:            log,
	}
}

func ipvsConfig(o *options, log *zap.Logger) ipvs.Config {
	// Named after the handover socket (per network namespace, in the
	// DaemonSet's /run/svcproxy, which outlives pods but not the node's
	// IPVS table): what the next svcproxy in this namespace needs to know
	// of this one's virtual servers.
	made := ""
	if o.handoverSocket != "" && len(o.ipvsExcludeCIDRs) > 0 {
		made = strings.TrimSuffix(o.handoverSocket, ".sock") + "-ipvs-excluded-made"
	}
	return ipvs.Config{
		MadeFile:          made,
		Scheduler:         o.ipvsScheduler,
		NodePortAddresses: o.nodePortAddresses,
		MasqueradeAll:     o.masqueradeAll,
		Mark:              o.masqueradeMark,
		DrainTimeout:      o.drainTimeout,
		Timeouts:          o.ipvsTimeouts,
		ExcludeCIDRs:      o.ipvsExcludeCIDRs,
		IPv6:              o.ipv6,
		Logger:            log,
	}
}

// watchRules reports changes another process makes to the rules of mode
// (every mode's chains are named SVCPROXY-*, and jumped to from the
// built-in chains of nat and filter) as they are committed, through
// nf_tables notifications. The userspace mode without steering has no
// rules; iptables-legacy makes no notifications. The nftables mode's own
// tables, and the nftables steering backend's, are not watched (yet):
// changes to them are repaired by the periodic full sync, which the error
// says.
func watchRules(ctx context.Context, mode proxymode.Name, o *options, changed func()) error {
	if mode == proxymode.Userspace && o.steering != "redirect" {
		return nil
	}
	if mode == proxymode.NFTables {
		return errors.New("the nftables mode's tables are not watched for changes")
	}
	if mode == proxymode.Userspace && o.steeredBy == redirect.BackendNFTables {
		return errors.New("the nftables steering table is not watched for changes")
	}
	v, err := (&netfilter.Exec{}).IPTablesVersion(ctx)
	if err != nil {
		return fmt.Errorf("reading the iptables backend: %w", err)
	}
	if !strings.Contains(v, "nf_tables") {
		return fmt.Errorf("%s makes no nf_tables notifications", v)
	}
	var tables []netfilter.Table
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		if fam == netfilter.IPv6 && !o.ipv6 {
			continue
		}
		tables = append(tables, netfilter.Table{Family: fam, Name: "nat"}, netfilter.Table{Family: fam, Name: "filter"})
	}
	builtin := map[string]bool{"PREROUTING": true, "INPUT": true, "FORWARD": true, "OUTPUT": true, "POSTROUTING": true}
	return netfilter.WatchRuleset(ctx, netfilter.WatchConfig{
		Tables: tables,
		Chains: func(c string) bool { return builtin[c] || strings.HasPrefix(c, "SVCPROXY-") },
		Own:    netfilter.Spawned,
	}, changed)
}
