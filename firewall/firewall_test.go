package firewall_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/svcproxy/svcproxy/firewall"
	"github.com/svcproxy/svcproxy/firewall/firewalltest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

var (
	ip  = netip.MustParseAddr
	pfx = netip.MustParsePrefix
	ap  = netip.MustParseAddrPort
)

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s {
		out = append(out, pfx(p))
	}
	return out
}

// web is a LoadBalancer Service on TCP 80 with every kind of frontend.
func web(ranges ...string) lb.Service {
	return lb.Service{
		Name: lb.ServicePortName{Namespace: "ns", Name: "web"}, Port: 80, NodePort: 30080,
		ClusterIPs: []netip.Addr{ip("10.96.0.10"), ip("fd00:96::10")}, ExternalIPs: []netip.Addr{ip("192.0.2.50")},
		LoadBalancerIPs:          []netip.Addr{ip("203.0.113.10"), ip("2001:db8::10")},
		LoadBalancerSourceRanges: prefixes(ranges...),
		Endpoints:                []lb.Endpoint{{Addr: ap("10.1.0.1:8080"), Ready: true, Serving: true}},
	}
}

func snapshot(t *testing.T, svcs ...lb.Service) *lb.Snapshot {
	t.Helper()
	snap, err := lb.NewStore(lb.StoreOptions{}).Replace(svcs)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

type packet struct {
	proto lb.Protocol
	src   string
	dst   string
	admit bool
}

func TestApplyAdmits(t *testing.T) {
	ctx := context.Background()
	dns := web("10.0.0.0/8")
	dns.Name.Name, dns.Protocol, dns.Port, dns.NodePort = "dns", lb.UDP, 53, 0
	for _, tc := range []struct {
		name    string
		svcs    []lb.Service
		ipv6    bool
		nodeIPs []netip.Addr
		packets []packet
		tables  []netfilter.Family
	}{
		{
			name:    "no ranges: nothing written",
			svcs:    []lb.Service{web()},
			ipv6:    true,
			packets: []packet{{lb.TCP, "198.51.100.1", "203.0.113.10:80", true}},
		},
		{
			name: "only the LoadBalancer IPs, at their port and protocol",
			svcs: []lb.Service{web("10.0.0.0/8", "fd00::/16"), dns},
			ipv6: true,
			packets: []packet{
				{lb.TCP, "10.2.3.4", "203.0.113.10:80", true},
				{lb.TCP, "198.51.100.1", "203.0.113.10:80", false},
				{lb.UDP, "198.51.100.1", "203.0.113.10:53", false},
				{lb.UDP, "10.2.3.4", "203.0.113.10:53", true},
				{lb.TCP, "198.51.100.1", "203.0.113.10:81", true},
				{lb.UDP, "198.51.100.1", "203.0.113.10:80", true},
				{lb.TCP, "198.51.100.1", "10.96.0.10:80", true},
				{lb.TCP, "198.51.100.1", "192.0.2.50:80", true},
				{lb.TCP, "fd00::5", "[2001:db8::10]:80", true},
				{lb.TCP, "2001:db8:1::5", "[2001:db8::10]:80", false},
			},
			tables: []netfilter.Family{netfilter.IPv4, netfilter.IPv6},
		},
		{
			name: "IPv6 off: its LoadBalancer IPs are left alone",
			svcs: []lb.Service{web("10.0.0.0/8", "fd00::/16")},
			packets: []packet{
				{lb.TCP, "198.51.100.1", "203.0.113.10:80", false},
				{lb.TCP, "2001:db8:1::5", "[2001:db8::10]:80", true},
			},
			tables: []netfilter.Family{netfilter.IPv4},
		},
		{
			name: "a family without ranges is open",
			svcs: []lb.Service{web("10.0.0.0/8")},
			ipv6: true,
			packets: []packet{
				{lb.TCP, "198.51.100.1", "203.0.113.10:80", false},
				{lb.TCP, "2001:db8:1::5", "[2001:db8::10]:80", true},
			},
			tables: []netfilter.Family{netfilter.IPv4},
		},
		{
			name: "overlapping and adjacent ranges merge",
			svcs: []lb.Service{web("10.1.0.0/16", "10.0.0.0/8", "11.0.0.0/8", "10.200.0.0/16", "13.0.0.0/8")},
			packets: []packet{
				{lb.TCP, "10.0.0.0", "203.0.113.10:80", true},
				{lb.TCP, "10.1.2.3", "203.0.113.10:80", true},
				{lb.TCP, "11.255.255.255", "203.0.113.10:80", true},
				{lb.TCP, "12.0.0.0", "203.0.113.10:80", false},
				{lb.TCP, "13.0.0.1", "203.0.113.10:80", true},
				{lb.TCP, "9.255.255.255", "203.0.113.10:80", false},
			},
			tables: []netfilter.Family{netfilter.IPv4},
		},
		{
			name:    "a range holding a node address admits the VIP itself",
			svcs:    []lb.Service{web("10.0.0.0/8")},
			nodeIPs: []netip.Addr{ip("10.0.0.5")},
			packets: []packet{
				{lb.TCP, "203.0.113.10", "203.0.113.10:80", true},
				{lb.TCP, "203.0.113.11", "203.0.113.10:80", false},
			},
			tables: []netfilter.Family{netfilter.IPv4},
		},
		{
			name: "an ingress IP that is also an ExternalIP or the ClusterIP is restricted, as kube-proxy's nftables mode",
			svcs: []lb.Service{func() lb.Service {
				s := web("10.0.0.0/8")
				s.LoadBalancerIPs = append(s.LoadBalancerIPs, ip("192.0.2.50"), ip("10.96.0.10"))
				return s
			}()},
			packets: []packet{
				{lb.TCP, "198.51.100.1", "192.0.2.50:80", false},
				{lb.TCP, "10.2.3.4", "192.0.2.50:80", true},
				{lb.TCP, "198.51.100.1", "10.96.0.10:80", false},
				{lb.TCP, "198.51.100.1", "203.0.113.10:80", false},
			},
			tables: []netfilter.Family{netfilter.IPv4},
		},
		{
			name: "the whole address space",
			svcs: []lb.Service{web("0.0.0.0/1", "128.0.0.0/1")},
			packets: []packet{
				{lb.TCP, "0.0.0.0", "203.0.113.10:80", true},
				{lb.TCP, "255.255.255.255", "203.0.113.10:80", true},
			},
			tables: []netfilter.Family{netfilter.IPv4},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := &firewalltest.Kernel{}
			f := firewall.New(firewall.Config{Kernel: k, IPv6: func() bool { return tc.ipv6 }, NodeIPs: tc.nodeIPs})
			if err := f.Apply(ctx, snapshot(t, tc.svcs...), false); err != nil {
				t.Fatal(err)
			}
			for _, p := range tc.packets {
				if got := k.Admits(p.proto, ip(p.src), ap(p.dst)); got != p.admit {
					t.Errorf("%v %s → %s admitted %v, want %v", p.proto, p.src, p.dst, got, p.admit)
				}
			}
			for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
				if got, want := k.Has(fam), slices.Contains(tc.tables, fam); got != want {
					t.Errorf("%v table there %v, want %v", fam, got, want)
				}
			}
		})
	}
}

func TestApplyWritesOnlyChanges(t *testing.T) {
	ctx := context.Background()
	k := &firewalltest.Kernel{}
	f := firewall.New(firewall.Config{Kernel: k})
	steps := []struct {
		name  string
		svc   lb.Service
		full  bool
		calls []string
	}{
		{"first: a predecessor's tables go", web(), false, []string{"delete IPv4", "delete IPv6"}},
		{"still nothing", web(), false, nil},
		{"ranges come", web("10.0.0.0/8"), false, []string{"write IPv4 2"}},
		{"the same", web("10.0.0.0/8"), false, nil},
		{"the same, full: repaired", web("10.0.0.0/8"), true, []string{"write IPv4 2"}},
		{"another range", web("10.0.0.0/8", "192.168.0.0/16"), false, []string{"write IPv4 3"}},
		{"ranges go", web(), false, []string{"delete IPv4"}},
		{"none, full", web(), true, []string{"delete IPv4"}},
	}
	for _, s := range steps {
		if err := f.Apply(ctx, snapshot(t, s.svc), s.full); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := k.Calls(); !slices.Equal(got, s.calls) {
			t.Errorf("%s: calls %q, want %q", s.name, got, s.calls)
		}
		if got, want := f.Frontends(), min(len(s.svc.LoadBalancerSourceRanges), 1); got != want {
			t.Errorf("%s: Frontends = %d, want %d", s.name, got, want)
		}
	}
}

// TestApplyRetriesAfterFailure: after a failed write or delete the next
// Apply tries again, even when what the table must hold is what the failed
// attempt wanted or what an earlier success wrote.
func TestApplyRetriesAfterFailure(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")
	k := &firewalltest.Kernel{}
	f := firewall.New(firewall.Config{Kernel: k})
	ranged, open := snapshot(t, web("10.0.0.0/8")), snapshot(t, web())
	steps := []struct {
		name  string
		snap  *lb.Snapshot
		fail  bool
		calls []string
		table bool // the IPv4 table after the step
	}{
		{"written", ranged, false, []string{"write IPv4 2", "delete IPv6"}, true},
		{"the removal fails", open, true, []string{"delete IPv4"}, true},
		{"no change since, but the removal is retried", open, false, []string{"delete IPv4"}, false},
		{"the write fails", ranged, true, []string{"write IPv4 2"}, false},
		{"back to no ranges: the failed write may have been half done, so remove", open, false, []string{"delete IPv4"}, false},
		{"nothing to do", open, false, nil, false},
	}
	for _, s := range steps {
		k.Fail = nil
		if s.fail {
			k.Fail = boom
		}
		err := f.Apply(ctx, s.snap, false)
		if s.fail != errors.Is(err, boom) {
			t.Fatalf("%s: Apply = %v", s.name, err)
		}
		if got := k.Calls(); !slices.Equal(got, s.calls) {
			t.Errorf("%s: calls %q, want %q", s.name, got, s.calls)
		}
		if got := k.Has(netfilter.IPv4); got != s.table {
			t.Errorf("%s: IPv4 table there %v, want %v", s.name, got, s.table)
		}
	}
}

// TestCleanup removes both families' tables, whatever this process wrote.
func TestCleanup(t *testing.T) {
	ctx := context.Background()
	k := &firewalltest.Kernel{}
	f := firewall.New(firewall.Config{Kernel: k, IPv6: func() bool { return true }})
	if err := f.Apply(ctx, snapshot(t, web("10.0.0.0/8", "fd00::/8")), false); err != nil {
		t.Fatal(err)
	}
	if err := firewall.New(firewall.Config{Kernel: k}).Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		if k.Has(fam) {
			t.Errorf("%v table there after Cleanup", fam)
		}
	}
}

// TestIPv6DecidedLater: whether IPv6 is served is asked at each Apply, as
// the daemon decides it after building the firewall.
func TestIPv6DecidedLater(t *testing.T) {
	ctx := context.Background()
	k := &firewalltest.Kernel{}
	ipv6 := false
	f := firewall.New(firewall.Config{Kernel: k, IPv6: func() bool { return ipv6 }})
	ipv6 = true
	if err := f.Apply(ctx, snapshot(t, web("10.0.0.0/8", "fd00::/8")), false); err != nil {
		t.Fatal(err)
	}
	if k.Admits(lb.TCP, ip("2001:db8:1::5"), ap("[2001:db8::10]:80")) {
		t.Error("the IPv6 LoadBalancer IP is open")
	}
	if got := f.Frontends(); got != 2 {
		t.Errorf("Frontends = %d, want 2", got)
	}
}
