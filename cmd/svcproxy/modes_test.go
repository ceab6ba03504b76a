package main

import (
	"context"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/proxymode"
)

// TestModesWithoutIPTablesRestore: on a node without iptables-restore no
// mode that programs through it can have installed anything, so their
// cleanups are left out; the nftables mode's is kept (it programs over
// netlink), so --cleanup still removes its tables.
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
		if got, want := e.Cleanup != nil, name == proxymode.NFTables; got != want {
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
