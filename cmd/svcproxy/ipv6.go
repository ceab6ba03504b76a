package main

import (
	"context"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/proxymode"
)

// ipv6Probe says why this node cannot serve IPv6, or nil when it can.
// rules: the mode writes ip6tables rules, so ip6tables must work too.
type ipv6Probe func(ctx context.Context, rules bool) error

// detectIPv6 decides whether mode serves IPv6 on this node, sets o.ipv6 and
// logs the decision. It returns why IPv6 is off, nil when it is on.
func detectIPv6(ctx context.Context, probe ipv6Probe, mode proxymode.Name, o *options, log *zap.Logger) error {
	rules := true // the iptables and IPVS modes program ip6tables
	switch mode {
	case proxymode.Userspace:
		rules = o.steering == "redirect"
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
