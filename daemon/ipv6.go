package daemon

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// Dual-stack
//
// Every mode serves IPv4. IPv6 is served too when the node has it (as
// kube-proxy decides in platformCheckSupported): the kernel has IPv6
// enabled, and, for a mode that writes ip6tables rules (REDIRECT
// steering, the iptables and IPVS modes), ip6tables works; the nftables
// mode programs its ip6 table over netlink. A node without it serves the
// IPv4 addresses of dual-stack Services, and says once per Service which
// IPv6 addresses are not served.

// HostIPv6 says why this node cannot serve IPv6, or nil when it can.
// rules: the mode writes ip6tables rules, so ip6tables must work too.
func HostIPv6(ctx context.Context, rules bool) error {
	if err := kernelIPv6("/proc"); err != nil {
		return err
	}
	if !rules {
		return nil
	}
	// As kube-proxy's iptables Present(): the IPv6 nat table can be read.
	if _, err := netfilter.NewExec("").IPTablesSave(ctx, netfilter.IPv6, "nat"); err != nil {
		return fmt.Errorf("ip6tables does not work: %w", err)
	}
	return nil
}

// kernelIPv6 says why the kernel cannot serve IPv6, or nil. On Linux, proc
// (/proc) must show IPv6 interfaces (net/if_inet6, as kube-proxy checks)
// and net.ipv6.conf.all.disable_ipv6 must be 0; everywhere, an IPv6 socket
// must bind to ::1.
func kernelIPv6(proc string) error {
	if runtime.GOOS == "linux" {
		if _, err := os.Stat(filepath.Join(proc, "net/if_inet6")); err != nil {
			return fmt.Errorf("the kernel has no IPv6: %w", err)
		}
		sysctl := filepath.Join(proc, "sys/net/ipv6/conf/all/disable_ipv6")
		v, err := os.ReadFile(sysctl)
		if err != nil {
			return fmt.Errorf("reading net.ipv6.conf.all.disable_ipv6: %w", err)
		}
		if s := strings.TrimSpace(string(v)); s != "0" {
			return fmt.Errorf("IPv6 is disabled (net.ipv6.conf.all.disable_ipv6 = %s)", s)
		}
	}
	pc, err := net.ListenPacket("udp6", "[::1]:0")
	if err != nil {
		return fmt.Errorf("cannot open an IPv6 socket on ::1: %w", err)
	}
	pc.Close()
	return nil
}

// unservedIPv6 warns about the Services whose IPv6 addresses this node does
// not serve: once for each such Service when it appears, not at every sync.
// A nil one warns about nothing (the node serves IPv6).
type unservedIPv6 struct {
	log    *zap.Logger
	reason error // why the node serves no IPv6
	last   *lb.Snapshot
	warned map[string]bool // namespace/name of the Services with IPv6 addresses in last
}

func newUnservedIPv6(reason error, log *zap.Logger) *unservedIPv6 {
	if reason == nil {
		return nil
	}
	return &unservedIPv6{log: log, reason: reason, warned: map[string]bool{}}
}

// check warns about each Service of snap with IPv6 addresses that the last
// snapshot checked did not have.
func (u *unservedIPv6) check(snap *lb.Snapshot) {
	if u == nil || snap == u.last {
		return
	}
	u.last = snap
	now := make(map[string]bool, len(u.warned))
	for _, b := range snap.Balancers() {
		svc := b.Service
		name := svc.Name.Namespace + "/" + svc.Name.Name
		if now[name] {
			continue // another port of a Service seen
		}
		var v6 []string
		for _, ips := range [][]netip.Addr{svc.ClusterIPs, svc.ExternalIPs, svc.LoadBalancerIPs} {
			for _, ip := range ips {
				if ip.Unmap().Is6() {
					v6 = append(v6, ip.String())
				}
			}
		}
		if len(v6) == 0 {
			continue
		}
		now[name] = true
		if !u.warned[name] {
			u.log.Warn("this node has no IPv6: the Service's IPv6 addresses are not served (its IPv4 ones are)",
				zap.String("service", name), zap.Strings("addresses", v6), zap.NamedError("reason", u.reason))
		}
	}
	u.warned = now
}
