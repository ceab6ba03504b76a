package lb

import (
	"net/netip"
	"slices"
	"testing"
)

func TestAllowedSources(t *testing.T) {
	pfx := netip.MustParsePrefix
	ip := netip.MustParseAddr
	lb4, lb6 := ip("203.0.113.7"), ip("2001:db8::7")
	for _, tc := range []struct {
		name    string
		ranges  []string
		lbIP    netip.Addr
		nodeIPs []netip.Addr
		want    []string // nil: every source
	}{
		{name: "no ranges", lbIP: lb4},
		{name: "own family only", ranges: []string{"10.0.0.0/8", "fd00::/8", "192.0.2.0/24"}, lbIP: lb4, want: []string{"10.0.0.0/8", "192.0.2.0/24"}},
		{name: "IPv6", ranges: []string{"10.0.0.0/8", "fd00::/8"}, lbIP: lb6, want: []string{"fd00::/8"}},
		{name: "other family only: open", ranges: []string{"fd00::/8"}, lbIP: lb4},
		{name: "a /0 opens it", ranges: []string{"10.0.0.0/8", "0.0.0.0/0"}, lbIP: lb4},
		{name: "the other family's /0 does not", ranges: []string{"10.0.0.0/8", "::/0"}, lbIP: lb4, want: []string{"10.0.0.0/8"}},
		{name: "node inside: the VIPs of the family too", ranges: []string{"10.0.0.0/8"}, lbIP: lb4, nodeIPs: []netip.Addr{ip("fd00::1"), ip("10.1.2.3")},
			want: []string{"10.0.0.0/8", "203.0.113.7/32", "203.0.113.8/32"}},
		{name: "node outside", ranges: []string{"10.0.0.0/8"}, lbIP: lb4, nodeIPs: []netip.Addr{ip("192.0.2.1")}, want: []string{"10.0.0.0/8"}},
		{name: "mapped VIP", ranges: []string{"10.0.0.0/8"}, lbIP: netip.AddrFrom16(lb4.As16()), nodeIPs: []netip.Addr{ip("10.0.0.1")},
			want: []string{"10.0.0.0/8", "203.0.113.7/32", "203.0.113.8/32"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Service{LoadBalancerIPs: []netip.Addr{tc.lbIP, ip("203.0.113.8"), ip("2001:db8::8")}}
			for _, r := range tc.ranges {
				s.LoadBalancerSourceRanges = append(s.LoadBalancerSourceRanges, pfx(r))
			}
			var want []netip.Prefix
			for _, w := range tc.want {
				want = append(want, pfx(w))
			}
			if got := s.AllowedSources(tc.lbIP, tc.nodeIPs); !slices.Equal(got, want) {
				t.Errorf("AllowedSources(%v) = %v, want %v", tc.lbIP, got, want)
			}
		})
	}
}

func TestSourceRange(t *testing.T) {
	for in, want := range map[string]string{
		"10.1.2.3/8":          "10.0.0.0/8",
		"::ffff:10.1.2.3/104": "10.0.0.0/8",
		"::ffff:0.0.0.0/96":   "0.0.0.0/0",
		"::ffff:0:0/80":       "::/80",
		"2001:db8::1/32":      "2001:db8::/32",
	} {
		if got := SourceRange(netip.MustParsePrefix(in)); got != netip.MustParsePrefix(want) {
			t.Errorf("SourceRange(%s) = %v, want %s", in, got, want)
		}
	}
}

// TestLoadBalancerIPAlsoServedOtherwise: an ingress IP that is also a
// ClusterIP or an ExternalIP of the Service is one frontend, served as
// that, with no conflict; it stays a LoadBalancer IP.
func TestLoadBalancerIPAlsoServedOtherwise(t *testing.T) {
	ip := netip.MustParseAddr
	svc := Service{
		Name: ServicePortName{Namespace: "ns", Name: "web"}, Port: 80,
		ClusterIPs: []netip.Addr{ip("10.96.0.1")}, ExternalIPs: []netip.Addr{ip("192.0.2.1")},
		LoadBalancerIPs: []netip.Addr{ip("192.0.2.1"), ip("10.96.0.1"), ip("203.0.113.1")},
		Endpoints:       []Endpoint{{Addr: netip.MustParseAddrPort("10.1.0.1:8080"), Ready: true, Serving: true}},
	}
	snap, err := NewStore(StoreOptions{}).Replace([]Service{svc})
	if err != nil {
		t.Fatalf("Replace: %v", err)
	}
	b := snap.Balancers()[0]
	var got []string
	for f, p := range snap.Frontends(b) {
		kind := "internal"
		if p == b.External {
			kind = "external"
		}
		got = append(got, f.Addr.Addr().String()+" "+kind)
	}
	if want := []string{"10.96.0.1 internal", "192.0.2.1 external", "203.0.113.1 external"}; !slices.Equal(got, want) {
		t.Errorf("frontends %v, want %v", got, want)
	}
	if len(b.Service.LoadBalancerIPs) != 3 {
		t.Errorf("LoadBalancerIPs %v, want all three kept", b.Service.LoadBalancerIPs)
	}
}
