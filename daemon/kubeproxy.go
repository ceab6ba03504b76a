package daemon

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/netfilter"
)

// kubeProxyChains are chains only kube-proxy's iptables and ipvs modes
// create (not kubelet's KUBE-FIREWALL or KUBE-KUBELET-CANARY), by table.
var kubeProxyChains = map[string][]string{
	"nat":    {"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-PROXY-CANARY"},
	"filter": {"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL", "KUBE-PROXY-CANARY"},
}

// KubeProxyTraces finds what kube-proxy installs, reading only: its chains
// through the netfilter executor, its nftables tables, its IPVS dummy
// interface. A nil field is not looked at.
type KubeProxyTraces struct {
	Exec       netfilter.Executor
	NFTTables  func(ctx context.Context) ([]byte, error) // as `nft list tables` prints them
	LinkExists func(name string) bool
}

// HostKubeProxyTraces reads this node's, with the tools it has.
func HostKubeProxyTraces() KubeProxyTraces {
	var t KubeProxyTraces
	if _, err := exec.LookPath("iptables"); err == nil {
		t.Exec = netfilter.NewExec("")
	}
	t.NFTTables = listNFTTables // nil where there is no nf_tables
	t.LinkExists = func(name string) bool { _, err := net.InterfaceByName(name); return err == nil }
	return t
}

// find returns what of kube-proxy's it found, e.g. "IPv4 nat KUBE-SERVICES".
// A tool that fails counts as finding nothing: this is a warning, never a
// reason not to start.
func (t KubeProxyTraces) find(ctx context.Context) []string {
	var found []string
	if t.Exec != nil {
		for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
			for _, table := range []string{"nat", "filter"} {
				out, err := t.Exec.IPTablesSaveChains(ctx, fam, table, kubeProxyChains[table])
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
	if t.NFTTables != nil {
		if out, err := t.NFTTables(ctx); err == nil {
			for _, line := range strings.Split(string(out), "\n") {
				if f := strings.Fields(line); len(f) == 3 && f[0] == "table" && f[2] == "kube-proxy" {
					found = append(found, "nftables table "+f[1]+" kube-proxy")
				}
			}
		}
	}
	if t.LinkExists != nil && t.LinkExists("kube-ipvs0") {
		found = append(found, "interface kube-ipvs0")
	}
	return found
}

// warnKubeProxy logs one warning when kube-proxy's rules are on this node.
func warnKubeProxy(ctx context.Context, t KubeProxyTraces, log *zap.Logger) {
	found := t.find(ctx)
	if len(found) == 0 {
		return
	}
	log.Warn("kube-proxy's rules are on this node: kube-proxy is running or left them behind, and its rules catch Service traffic before or beside svcproxy's. "+
		"Stop kube-proxy (delete its DaemonSet, or keep it off this node), then remove its rules once with `kube-proxy --cleanup` on the node, or reboot the node",
		zap.Strings("found", found))
}
