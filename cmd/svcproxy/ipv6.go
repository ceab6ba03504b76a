package main

import (
	"context"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/proxymode"
	"github.com/svcproxy/svcproxy/redirect"
)

// ipv6Probe says why this node cannot serve IPv6, or nil when it can.
// rules: the mode writes ip6tables rules, so ip6tables must work too.
type ipv6Probe func(ctx context.Context, rules bool) error

// nftSteeringProbe says why the nftables steering backend cannot write its
// tables (both families) here, or nil when it can: with
// --steering-backend=auto it decides whether REDIRECT steering will need
// ip6tables.
type nftSteeringProbe func(ctx context.Context) error

// hostNFTSteering is the nftables steering backend's probe on this node:
// a throwaway table written and deleted in each family.
func hostNFTSteering(o *options) nftSteeringProbe {
	return func(ctx context.Context) error {
		_, err := redirect.Available(ctx, redirect.Config{Backend: redirect.BackendNFTables, Mark: uint32(max(o.mark, 1)), IPv6: true})
		return err
	}
}

// detectIPv6 decides whether mode serves IPv6 on this node, sets o.ipv6 and
// logs the decision. It returns why IPv6 is off, nil when it is on.
func detectIPv6(ctx context.Context, probe ipv6Probe, nftSteering nftSteeringProbe, mode proxymode.Name, o *options, log *zap.Logger) error {
	rules := true // the iptables and IPVS modes program ip6tables
	switch mode {
	case proxymode.Userspace:
		rules = o.steering == "redirect" && steeringNeedsIP6Tables(ctx, nftSteering, o.steeringBackend)
	case proxymode.NFTables:
		rules = false // its ip6 table is made over netlink, not with ip6tables
	}
	err := probe(ctx, rules)
	o.ipv6 = err == nil
	if err != nil {
		log.Info("serving IPv4 only: this node cannot serve IPv6", zap.String("mode", string(mode)), zap.Error(err))
		return err
	}
	log.Info("serving IPv4 and IPv6", zap.String("mode", string(mode)))
	return nil
}

// steeringNeedsIP6Tables tells whether REDIRECT steering with backend
// writes ip6tables rules: the iptables backend does; the nftables one
// makes its ip6 table over netlink; auto is nftables where nftables
// steering works (nftSteering), else iptables.
func steeringNeedsIP6Tables(ctx context.Context, nftSteering nftSteeringProbe, backend redirect.Backend) bool {
	switch backend {
	case redirect.BackendNFTables:
		return false
	case redirect.BackendIPTables:
		return true
	}
	return nftSteering(ctx) != nil
}
