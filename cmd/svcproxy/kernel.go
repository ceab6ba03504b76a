package main

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/kernelmodes/iptables"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// kernelMode is a mode whose rules the kernel runs by itself.
type kernelMode interface {
	Apply(ctx context.Context, snap *lb.Snapshot, full bool) error
	Cleanup(ctx context.Context) error
	Repairs() uint64
	RestoreFailures(family netfilter.Family) uint64
}

// kernel drives a kernel mode. On exit it leaves the rules in place, as
// kube-proxy does: Services keep working while svcproxy restarts, and the
// next svcproxy takes the rules over with its first full sync.
type kernel struct{ m kernelMode }

func (k kernel) Apply(ctx context.Context, snap *lb.Snapshot, full bool) error {
	return k.m.Apply(ctx, snap, full)
}

func (k kernel) Shutdown(context.Context, bool) error { return nil }

func newIPTablesMode(o *options, log *zap.Logger) (*iptables.Mode, error) {
	return iptables.New(iptablesConfig(o, log))
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

func newIPVSMode(o *options, log *zap.Logger) (*ipvs.Mode, error) {
	return ipvs.New(ipvsConfig(o, log))
}

func ipvsConfig(o *options, log *zap.Logger) ipvs.Config {
	return ipvs.Config{
		Scheduler:         o.ipvsScheduler,
		NodePortAddresses: o.nodePortAddresses,
		MasqueradeAll:     o.masqueradeAll,
		Mark:              o.masqueradeMark,
		DrainTimeout:      o.drainTimeout,
		IPv6:              o.ipv6,
		Logger:            log,
	}
}

// newKernel builds a kernel mode's dataplane and exports its repair and
// iptables-restore failure counts, the latter per family it programs
// (families: kube-proxy's ip_family label values).
func newKernel(name string, m kernelMode, reg prometheus.Registerer, families []string) kernel {
	registerRestoreFailures(reg, families, m.RestoreFailures)
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "svcproxy", Subsystem: name, Name: "repairs_total",
		Help: "Full syncs that found the " + name + " mode's rules tampered with and repaired them.",
	}, func() float64 { return float64(m.Repairs()) }))
	return kernel{m}
}

// kubeProxyChains are chains only kube-proxy's iptables and ipvs modes
// create (not kubelet's KUBE-FIREWALL or KUBE-KUBELET-CANARY), by table.
var kubeProxyChains = map[string][]string{
	"nat":    {"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-PROXY-CANARY"},
	"filter": {"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL", "KUBE-PROXY-CANARY"},
}

// kubeProxyTraces finds what kube-proxy installs, reading only: its chains
// through the netfilter executor, its nftables tables, its IPVS dummy
// interface. A nil field is not looked at.
type kubeProxyTraces struct {
	exec       netfilter.Executor
	nftTables  func(ctx context.Context) ([]byte, error) // `nft list tables`
	linkExists func(name string) bool
}

// hostKubeProxyTraces reads this node's, with the tools it has.
func hostKubeProxyTraces() kubeProxyTraces {
	var t kubeProxyTraces
	if _, err := exec.LookPath("iptables"); err == nil {
		t.exec = netfilter.NewExec("")
	}
	if _, err := exec.LookPath("nft"); err == nil {
		t.nftTables = func(ctx context.Context) ([]byte, error) {
			return exec.CommandContext(ctx, "nft", "list", "tables").Output()
		}
	}
	t.linkExists = func(name string) bool { _, err := net.InterfaceByName(name); return err == nil }
	return t
}

// find returns what of kube-proxy's it found, e.g. "IPv4 nat KUBE-SERVICES".
// A tool that fails counts as finding nothing: this is a warning, never a
// reason not to start.
func (t kubeProxyTraces) find(ctx context.Context) []string {
	var found []string
	if t.exec != nil {
		for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
			for _, table := range []string{"nat", "filter"} {
				out, err := t.exec.IPTablesSaveChains(ctx, fam, table, kubeProxyChains[table])
				if err != nil {
					continue
				}
				for _, line := range strings.Split(string(out), "\n") {
					if name, ok := strings.CutPrefix(line, ":"); ok {
						found = append(found, fmt.Sprintf("%s %s %s", fam, table, strings.Fields(name)[0]))
					}
				}
			}
		}
	}
	if t.nftTables != nil {
		if out, err := t.nftTables(ctx); err == nil {
			for _, line := range strings.Split(string(out), "\n") {
				if f := strings.Fields(line); len(f) == 3 && f[0] == "table" && f[2] == "kube-proxy" {
					found = append(found, "nftables table "+f[1]+" kube-proxy")
				}
			}
		}
	}
	if t.linkExists != nil && t.linkExists("kube-ipvs0") {
		found = append(found, "interface kube-ipvs0")
	}
	return found
}

// warnKubeProxy logs one warning when kube-proxy's rules are on this node.
func warnKubeProxy(ctx context.Context, t kubeProxyTraces, log *zap.Logger) {
	found := t.find(ctx)
	if len(found) == 0 {
		return
	}
	log.Warn("kube-proxy's rules are on this node: kube-proxy is running or left them behind, and its rules catch Service traffic before or beside svcproxy's. "+
		"Stop kube-proxy (delete its DaemonSet, or keep it off this node), then remove its rules once with `kube-proxy --cleanup` on the node, or reboot the node",
		zap.Strings("found", found))
}
