package main

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/svcproxy/svcproxy/daemon"
	"github.com/svcproxy/svcproxy/proxymode"
	"github.com/svcproxy/svcproxy/runner"
	"github.com/svcproxy/svcproxy/userspace"
)

// TestIPv6Detection: with the probe saying the node has IPv6, every mode's
// configuration serves it (REDIRECT and the iptables and IPVS modes
// program ip6tables, the nftables mode its ip6 table, the forwarder listens
// on [::] too) and the metrics carry ip_family="IPv6"; without, none does.
// Modes that write ip6tables rules ask the probe about ip6tables; the
// nftables mode, which programs over netlink, does not.
func TestIPv6Detection(t *testing.T) {
	noIP6Tables := errors.New("ip6tables does not work: exit status 3")
	disabled := errors.New("IPv6 is disabled (net.ipv6.conf.all.disable_ipv6 = 1)")
	for _, tc := range []struct {
		name      string
		args      []string
		mode      proxymode.Name
		probe     error
		wantRules bool // the probe is asked whether ip6tables works
	}{
		{"userspace with REDIRECT steering", []string{"--steering=redirect"}, proxymode.Userspace, nil, true},
		{"userspace without steering", nil, proxymode.Userspace, nil, false},
		{"iptables", nil, proxymode.IPTables, nil, true},
		{"ipvs", nil, proxymode.IPVS, nil, true},
		{"nftables", nil, proxymode.NFTables, nil, false},
		{"nftables, REDIRECT steering given", []string{"--steering=redirect"}, proxymode.NFTables, nil, false},
		{"REDIRECT steering without ip6tables", []string{"--steering=redirect"}, proxymode.Userspace, noIP6Tables, true},
		{"iptables, IPv6 disabled", nil, proxymode.IPTables, disabled, true},
		{"ipvs, IPv6 disabled", nil, proxymode.IPVS, disabled, true},
		{"nftables, IPv6 disabled", nil, proxymode.NFTables, disabled, false},
		{"userspace without steering, IPv6 disabled", nil, proxymode.Userspace, disabled, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args, outsidePod)
			if err != nil {
				t.Fatal(err)
			}
			var asked []bool
			probe := func(_ context.Context, rules bool) error { asked = append(asked, rules); return tc.probe }
			core, logs := observer.New(zap.InfoLevel)
			err = detectIPv6(context.Background(), probe, tc.mode, o, zap.New(core))
			if !errors.Is(err, tc.probe) {
				t.Errorf("detectIPv6 = %v, want %v", err, tc.probe)
			}
			if want := []bool{tc.wantRules}; !slices.Equal(asked, want) {
				t.Errorf("probe asked with rules %v, want %v", asked, want)
			}
			if logs.Len() != 1 {
				t.Errorf("%d log lines, want one saying what is served", logs.Len())
			}
			on := tc.probe == nil
			log := zap.NewNop()
			for what, got := range map[string]bool{
				"redirect.Config.IPv6": redirectConfig(o, log).IPv6,
				"iptables.Config.IPv6": iptablesConfig(o, log).IPv6,
				"ipvs.Config.IPv6":     ipvsConfig(o, log).IPv6,
				"nftables.Config.IPv6": nftablesConfig(o, log).IPv6,
			} {
				if got != on {
					t.Errorf("%s = %v, want %v", what, got, on)
				}
			}
			wantAddrs := []netip.AddrPort{netip.MustParseAddrPort("0.0.0.0:15001")}
			wantFamilies := []string{runner.IPv4}
			if on {
				wantAddrs = append(wantAddrs, netip.MustParseAddrPort("[::]:15001"))
				wantFamilies = append(wantFamilies, runner.IPv6)
			}
			if got := userspace.RedirectAddrs(o.redirectPort, redirectConfig(o, log).IPv6); !slices.Equal(got, wantAddrs) {
				t.Errorf("forwarder redirect listeners %v, want %v", got, wantAddrs)
			}
			// The metrics' ip_family label values are these families
			// (daemon's TestFamilyLabels).
			if got := daemon.Families(o.ipv6); !slices.Equal(got, wantFamilies) {
				t.Errorf("ip_family label values %v, want %v", got, wantFamilies)
			}
		})
	}
}
