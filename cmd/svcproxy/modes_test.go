package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/conntrack/conntracktest"
	"github.com/svcproxy/svcproxy/daemon"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
	"github.com/svcproxy/svcproxy/proxymode"
	"github.com/svcproxy/svcproxy/redirect"
	"github.com/svcproxy/svcproxy/redirect/steertable/steertabletest"
)

// TestModesWithoutIPTablesRestore: on a node without iptables-restore no
// mode that programs through it can have installed anything, so their
// cleanups are left out; the nftables mode's is kept (it programs over
// netlink), and so is the userspace mode's (its nftables steering backend
// does too), so --cleanup still removes their tables.
func TestModesWithoutIPTablesRestore(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	o, err := parseFlags(nil, outsidePod)
	if err != nil {
		t.Fatal(err)
	}
	table := modes(o, prometheus.NewRegistry(), zap.NewNop(), nil)
	var names []string
	for name, e := range table {
		names = append(names, string(name))
		if got, want := e.Cleanup != nil, name == proxymode.NFTables || name == proxymode.Userspace; got != want {
			t.Errorf("%s: has a cleanup %v, want %v", name, got, want)
		}
	}
	slices.Sort(names)
	if want := []string{"iptables", "ipvs", "nftables", "userspace"}; !slices.Equal(names, want) {
		t.Errorf("modes %v, want %v", names, want)
	}
	if table[proxymode.NFTables].Probe == nil || table[proxymode.NFTables].New == nil {
		t.Error("the nftables entry has no probe or no constructor")
	}
}

// TestNFTablesConfig: the nftables mode is configured from the same flags
// as the iptables mode.
func TestNFTablesConfig(t *testing.T) {
	o, err := parseFlags([]string{"--proxy-mode=nftables", "--services=x.yaml", "--nodeport-addresses=10.0.0.0/8",
		"--cluster-cidr=10.244.0.0/16,fd00::/48", "--masquerade-all", "--iptables-masquerade-bit=15", "--mark=0x1000"}, outsidePod)
	if err != nil {
		t.Fatal(err)
	}
	o.ipv6 = true
	log := zap.NewNop()
	got, ipt := nftablesConfig(o, log), iptablesConfig(o, log)
	if got.Mark != 1<<15 || got.AvoidMark != 0x1000 || !got.MasqueradeAll || !got.IPv6 || got.Logger != log ||
		!slices.Equal(got.NodePortAddresses, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}) ||
		!slices.Equal(got.ClusterCIDRs, []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00::/48")}) {
		t.Errorf("nftablesConfig = %+v", got)
	}
	for _, f := range []string{"Mark", "AvoidMark", "NodePortAddresses", "ClusterCIDRs", "MasqueradeAll", "IPv6"} {
		if a, b := reflect.ValueOf(got).FieldByName(f).Interface(), reflect.ValueOf(ipt).FieldByName(f).Interface(); !reflect.DeepEqual(a, b) {
			t.Errorf("%s: nftables %v, iptables %v", f, a, b)
		}
	}
}

// TestWatchRulesNFTables: the nftables mode's tables are not watched, and
// the error says so (the daemon logs that they are repaired at the full
// sync only); no iptables is run to find out.
func TestWatchRulesNFTables(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	o, err := parseFlags(nil, outsidePod)
	if err != nil {
		t.Fatal(err)
	}
	err = watchRules(context.Background(), proxymode.NFTables, o, func() { t.Error("changed called") })
	if err == nil || !strings.Contains(err.Error(), "nftables") {
		t.Errorf("watchRules(nftables) = %v, want an error saying the nftables tables are not watched", err)
	}
}

// TestWatchRulesNFTablesSteering: steering written by the nftables
// backend is not watched through iptables' notifications (its table is
// its own): the error says so, and the periodic full sync repairs it.
func TestWatchRulesNFTablesSteering(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	o, err := parseFlags([]string{"--steering=redirect"}, outsidePod)
	if err != nil {
		t.Fatal(err)
	}
	o.steeredBy = redirect.BackendNFTables // as newUserspace records it
	err = watchRules(context.Background(), proxymode.Userspace, o, func() { t.Error("changed called") })
	if err == nil || !strings.Contains(err.Error(), "nftables steering table") {
		t.Errorf("watchRules(userspace on nftables) = %v, want an error saying the steering table is not watched", err)
	}
}

// TestSteeringFailuresMetrics: the userspace mode's steering exports its
// failed writes under the counter kube-proxy names for the backend that
// writes them, and only that one: the nftables backend's failed
// transactions as kubeproxy_sync_proxy_rules_nftables_sync_failures_total
// (as the nftables mode's), the iptables backend's failed iptables-restore
// runs as kubeproxy_sync_proxy_rules_iptables_restore_failures_total. Each
// moves by one on a failed write and not on the good syncs around it. The
// conntrack entries it deleted are kube-proxy's
// kubeproxy_conntrack_reconciler_deleted_entries_total. The redirector runs
// over both backends' and conntrack's fakes, so no root is needed.
func TestSteeringFailuresMetrics(t *testing.T) {
	const (
		nftKey = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
		iptKey = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total"
	)
	store := lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: "node-a"}})
	snap, err := store.Replace([]lb.Service{{Name: lb.ServicePortName{Namespace: "ns", Name: "web"}, Port: 80,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Endpoints:  []lb.Endpoint{{Addr: netip.MustParseAddrPort("10.244.0.1:8080"), Ready: true, Serving: true}}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		backend      redirect.Backend
		key, absent  string
		failNext     func(ipt *netfiltertest.Fake, nft *steertabletest.Fake)
		heal         func(ipt *netfiltertest.Fake, nft *steertabletest.Fake)
		wantDescribe string
	}{
		{redirect.BackendNFTables, nftKey, iptKey,
			func(_ *netfiltertest.Fake, nft *steertabletest.Fake) {
				nft.Fail("setup", errors.New("injected: netlink transaction refused"))
			},
			func(_ *netfiltertest.Fake, nft *steertabletest.Fake) { nft.Fail("setup", nil) },
			"nftables (table svcproxy-steering)"},
		{redirect.BackendIPTables, iptKey, nftKey,
			func(ipt *netfiltertest.Fake, _ *steertabletest.Fake) {
				ipt.FailNext("iptables-restore", errors.New("injected: iptables-restore exited 1"))
			},
			func(*netfiltertest.Fake, *steertabletest.Fake) {},
			"iptables (nf_tables) + ipset"},
	} {
		t.Run(string(tc.backend), func(t *testing.T) {
			ipt, nft := netfiltertest.NewFake(), steertabletest.NewFake()
			o, err := parseFlags([]string{"--steering=redirect", "--steering-backend=" + string(tc.backend)}, outsidePod)
			if err != nil {
				t.Fatal(err)
			}
			rc := redirectConfig(o, zaptest.NewLogger(t))
			ct := &conntracktest.Table{}
			ct.Add(netfilter.IPv4, conntrack.Flow{Proto: lb.TCP, OrigSrc: netip.MustParseAddrPort("10.244.0.9:40000"),
				OrigDst: netip.MustParseAddrPort("10.96.0.10:80"), ReplySrc: netip.MustParseAddrPort("10.96.0.10:80"), TCPState: conntrack.SynSent})
			rc.Exec, rc.NFT, rc.Conntrack = ipt, nft, ct
			red, err := redirect.New(rc)
			if err != nil {
				t.Fatal(err)
			}
			if red.Backend() != tc.backend || red.Describe() != tc.wantDescribe {
				t.Fatalf("steering with %s (%q), want %s (%q)", red.Backend(), red.Describe(), tc.backend, tc.wantDescribe)
			}
			reg := prometheus.NewPedanticRegistry()
			registerSteering(reg, daemon.Families(o.ipv6), red)
			ctx := context.Background()
			step := func(name string, fail bool, want float64) {
				t.Helper()
				if fail {
					tc.failNext(ipt, nft)
				}
				err := red.Apply(ctx, snap, redirect.Ports{TCP: 15001}, true)
				if (err != nil) != fail {
					t.Fatalf("%s: Apply = %v, want failure %v", name, err, fail)
				}
				tc.heal(ipt, nft)
				got := gatherCounters(t, reg)
				if v, ok := got[tc.key+`{ip_family="IPv4"}`]; !ok || v != want {
					t.Errorf("%s: %s = %v (present %v), want %v; all: %v", name, tc.key, v, ok, want, got)
				}
				for k := range got {
					if strings.HasPrefix(k, tc.absent) {
						t.Errorf("%s: %s exported with the %s backend", name, k, tc.backend)
					}
				}
			}
			step("a good sync", false, 0)
			step("a failed write", true, 1)
			step("the good sync after it", false, 1)
			// The SYN that reached the ClusterIP before any rule went.
			const ctKey = `kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"}`
			if got := gatherCounters(t, reg); got[ctKey] != 1 {
				t.Errorf("%s = %v, want 1; all: %v", ctKey, got[ctKey], got)
			}
		})
	}
}

// gatherCounters is every counter in reg, keyed as name{label="value",...}.
func gatherCounters(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			key := mf.GetName()
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			out[key] = m.GetCounter().GetValue()
		}
	}
	return out
}
