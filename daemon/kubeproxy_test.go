package daemon

import (
	"context"
	"errors"
	"slices"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
)

// TestKubeProxyTraces: kube-proxy's chains, nftables tables and IPVS
// interface are found, read-only; kubelet's chains and svcproxy's own are not.
func TestKubeProxyTraces(t *testing.T) {
	const kubeletOnly = "*filter\n:KUBE-FIREWALL - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n*nat\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"
	const kubeProxyIPTables = "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-POSTROUTING - [0:0]\n" +
		"-A PREROUTING -j KUBE-SERVICES\n-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\nCOMMIT\n" +
		"*filter\n:KUBE-FORWARD - [0:0]\n-A FORWARD -j KUBE-FORWARD\nCOMMIT\n"
	const svcproxyOwn = "*nat\n:SVCPROXY-SERVICES - [0:0]\n-A PREROUTING -j SVCPROXY-SERVICES\nCOMMIT\n"
	nftWith := func(out string, err error) func(context.Context) ([]byte, error) {
		return func(context.Context) ([]byte, error) { return []byte(out), err }
	}
	for _, tc := range []struct {
		name    string
		v4, v6  string // iptables-restore input per family
		nft     func(context.Context) ([]byte, error)
		ipvsDev bool
		want    []string
	}{
		{name: "clean node", nft: nftWith("table inet filter\n", nil)},
		{name: "kubelet's chains only", v4: kubeletOnly, v6: kubeletOnly},
		{name: "svcproxy's own rules", v4: svcproxyOwn},
		{name: "kube-proxy iptables mode", v4: kubeProxyIPTables, v6: "*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n",
			want: []string{"IPv4 nat KUBE-NODEPORTS", "IPv4 nat KUBE-POSTROUTING", "IPv4 nat KUBE-SERVICES", "IPv4 filter KUBE-FORWARD", "IPv6 nat KUBE-SERVICES"}},
		{name: "kube-proxy nftables mode", nft: nftWith("table ip filter\ntable ip kube-proxy\ntable ip6 kube-proxy\n", nil),
			want: []string{"nftables table ip kube-proxy", "nftables table ip6 kube-proxy"}},
		{name: "kube-proxy ipvs mode", ipvsDev: true, want: []string{"interface kube-ipvs0"}},
		{name: "nft fails: nothing found, no error", nft: nftWith("table ip kube-proxy\n", errors.New("permission denied"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			f := netfiltertest.NewFake()
			for fam, data := range map[netfilter.Family]string{netfilter.IPv4: tc.v4, netfilter.IPv6: tc.v6} {
				if data == "" {
					continue
				}
				if err := f.IPTablesRestore(ctx, fam, []byte(data)); err != nil {
					t.Fatal(err)
				}
			}
			f.ResetCalls()
			traces := KubeProxyTraces{Exec: f, NFTTables: tc.nft, LinkExists: func(name string) bool { return tc.ipvsDev && name == "kube-ipvs0" }}
			got := traces.find(ctx)
			slices.Sort(got)
			want := slices.Clone(tc.want)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("found %q, want %q", got, want)
			}
			for _, c := range f.Calls() {
				if c.Op != "iptables-save-chains" {
					t.Errorf("detection made a %s call: it must only read", c.Op)
				}
			}

			core, logs := observer.New(zap.WarnLevel)
			warnKubeProxy(ctx, traces, zap.New(core))
			if n := logs.Len(); (len(want) > 0 && n != 1) || (len(want) == 0 && n != 0) {
				t.Errorf("%d warnings logged, want %d", n, min(len(want), 1))
			}
		})
	}
}
