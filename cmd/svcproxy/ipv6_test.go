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
// nftables mode, which programs over netlink, does not, nor does REDIRECT
// steering on the nftables backend: chosen, or auto's choice where the
// nftables steering probe succeeds. Only auto asks that probe.
func TestIPv6Detection(t *testing.T) {
	noIP6Tables := errors.New("ip6tables does not work: exit status 3")
	disabled := errors.New("IPv6 is disabled (net.ipv6.conf.all.disable_ipv6 = 1)")
	noNFT := errors.New("writing table svcproxy-steering: operation not supported")
	for _, tc := range []struct {
		name      string
		args      []string
		mode      proxymode.Name
		probe     error
		nft       error // what the nftables steering probe says
		wantRules bool  // the probe is asked whether ip6tables works
		wantNFT   bool  // the nftables steering probe is asked
	}{
		{"userspace with REDIRECT steering, auto, nftables works", []string{"--steering=redirect"}, proxymode.Userspace, nil, nil, false, true},
		{"userspace with REDIRECT steering, auto, no nftables", []string{"--steering=redirect"}, proxymode.Userspace, nil, noNFT, true, true},
		{"userspace with REDIRECT steering on nftables", []string{"--steering=redirect", "--steering-backend=nftables"}, proxymode.Userspace, nil, nil, false, false},
		{"userspace with REDIRECT steering on iptables", []string{"--steering=redirect", "--steering-backend=iptables"}, proxymode.Userspace, nil, nil, true, false},
		{"userspace without steering", nil, proxymode.Userspace, nil, nil, false, false},
		{"userspace without steering, backend given", []string{"--steering-backend=iptables"}, proxymode.Userspace, nil, nil, false, false},
		{"iptables", nil, proxymode.IPTables, nil, nil, true, false},
		{"ipvs", nil, proxymode.IPVS, nil, nil, true, false},
		{"nftables", nil, proxymode.NFTables, nil, nil, false, false},
		{"nftables, REDIRECT steering given", []string{"--steering=redirect"}, proxymode.NFTables, nil, nil, false, false},
		{"REDIRECT steering on iptables without ip6tables", []string{"--steering=redirect", "--steering-backend=iptables"}, proxymode.Userspace, noIP6Tables, nil, true, false},
		{"REDIRECT steering, auto, without nftables or ip6tables", []string{"--steering=redirect"}, proxymode.Userspace, noIP6Tables, noNFT, true, true},
		{"REDIRECT steering on nftables, IPv6 disabled", []string{"--steering=redirect", "--steering-backend=nftables"}, proxymode.Userspace, disabled, nil, false, false},
		{"iptables, IPv6 disabled", nil, proxymode.IPTables, disabled, nil, true, false},
		{"ipvs, IPv6 disabled", nil, proxymode.IPVS, disabled, nil, true, false},
		{"nftables, IPv6 disabled", nil, proxymode.NFTables, disabled, nil, false, false},
		{"userspace without steering, IPv6 disabled", nil, proxymode.Userspace, disabled, nil, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args, outsidePod)
			if err != nil {
				t.Fatal(err)
			}
			var asked []bool
			probe := func(_ context.Context, rules bool) error { asked = append(asked, rules); return tc.probe }
			nftAsked := 0
			nft := func(context.Context) error { nftAsked++; return tc.nft }
			core, logs := observer.New(zap.InfoLevel)
			err = detectIPv6(context.Background(), probe, nft, tc.mode, o, zap.New(core))
			if !errors.Is(err, tc.probe) {
				t.Errorf("detectIPv6 = %v, want %v", err, tc.probe)
			}
			if want := []bool{tc.wantRules}; !slices.Equal(asked, want) {
				t.Errorf("probe asked with rules %v, want %v", asked, want)
			}
			if got := nftAsked > 0; got != tc.wantNFT {
				t.Errorf("nftables steering probe asked %d times, want asked: %v", nftAsked, tc.wantNFT)
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
