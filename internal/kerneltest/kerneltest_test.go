package kerneltest

import (
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/lb"
)

func TestInput(t *testing.T) {
	in := NewInput([]byte{7, 200})
	if got := in.Pick(5); got != 2 {
		t.Errorf("Pick(5) of 7 = %d, want 2", got)
	}
	if got := in.Next(); got != 200 {
		t.Errorf("Next = %d, want 200", got)
	}
	if got := in.Next(); got != 0 {
		t.Errorf("Next past the end = %d, want 0", got)
	}
	if got := NewInput(nil).Services(ServiceOptions{MaxEndpoints: 2}); len(got) != 0 {
		t.Errorf("Services of no input = %v, want none", got)
	}
}

// TestServices pins the decoding: the committed fuzz corpora of the
// packages that use it mean what they meant.
func TestServices(t *testing.T) {
	node := netip.MustParseAddr("192.0.2.10")
	shared := []netip.AddrPort{netip.MustParseAddrPort("10.244.9.9:80"), netip.MustParseAddrPort("10.244.9.8:80")}
	for _, tc := range []struct {
		name string
		opts ServiceOptions
		in   []byte
		want lb.Service
	}{
		{"own endpoints", ServiceOptions{Node: "here", NodeIPs: []netip.Addr{node}, MaxEndpoints: 2},
			// 1 Service: s3, UDP, port 80, NodePort 30001, Local/Cluster, ClusterIP node,
			// ExternalIP 10.96.0.2, no LB IP, 2 endpoints (local+ready, serving).
			[]byte{1, 3, 1, 1, 2, 1, 0, 1, 4, 1, 1, 0, 2, 3, 4},
			lb.Service{Name: lb.ServicePortName{Namespace: "ns", Name: "s3"}, Protocol: lb.UDP, Port: 80, NodePort: 30001,
				ExternalTrafficPolicy: lb.PolicyLocal, ClusterIPs: []netip.Addr{node}, ExternalIPs: []netip.Addr{netip.MustParseAddr("10.96.0.2")},
				Endpoints: []lb.Endpoint{
					{Addr: netip.MustParseAddrPort("10.244.0.1:8080"), Ready: true, NodeName: "here"},
					{Addr: netip.MustParseAddrPort("10.244.0.2:8080"), Serving: true, NodeName: "node-b"},
				}}},
		{"shared endpoints and affinity", ServiceOptions{Node: "here", Affinity: true, MaxEndpoints: 3, Endpoints: shared},
			// s0 TCP 53, no NodePort, Cluster/Cluster, affinity 5 s, no IPs, 1 endpoint: the second.
			[]byte{1, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 1, 6, 1},
			lb.Service{Name: lb.ServicePortName{Namespace: "ns", Name: "s0"}, Port: 53, AffinityTimeout: 5 * time.Second,
				Endpoints: []lb.Endpoint{{Addr: shared[1], Ready: true, Serving: true, NodeName: "node-b"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := NewInput(tc.in).Services(tc.opts)
			if len(got) != 1 || !reflect.DeepEqual(got[0], tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestDestinations(t *testing.T) {
	svcs := []lb.Service{
		{Port: 80, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")}, NodePort: 30000},
		{Port: 80, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")}}, // the same frontend again
	}
	got := Destinations(svcs, netip.MustParseAddr("192.0.2.10"))
	var want []netip.AddrPort
	for _, s := range []string{"8.8.8.8:53", "10.96.0.1:80", "127.0.0.1:30000", "192.0.2.10:30000", "192.0.2.99:30000", "[::1]:30000", "[2001:4860::8888]:80"} {
		want = append(want, netip.MustParseAddrPort(s))
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
}

func TestScale(t *testing.T) {
	svcs := ScaleServices(70000)
	seen := map[netip.Addr]bool{}
	for _, s := range svcs {
		if seen[s.ClusterIPs[0]] {
			t.Fatalf("%v: ClusterIP %v used twice", s.Name, s.ClusterIPs[0])
		}
		seen[s.ClusterIPs[0]] = true
	}
	if got := Median([]time.Duration{3, 1, 2, 4}); got != 3 {
		t.Errorf("Median(3, 1, 2, 4) = %v, want 3", got)
	}
	if got := Ms(12345 * time.Microsecond); got != "12.3 ms" {
		t.Errorf("Ms = %q", got)
	}
}
