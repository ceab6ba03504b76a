package conntrack_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/conntrack/conntracktest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func tcp(s string) lb.Frontend { return lb.Frontend{Protocol: lb.TCP, Addr: ap(s)} }

func service(name string, endpoints int, vips ...string) lb.Service {
	svc := lb.Service{Name: lb.ServicePortName{Namespace: "ns", Name: name}, Port: 80}
	for _, v := range vips {
		svc.ClusterIPs = append(svc.ClusterIPs, netip.MustParseAddr(v))
	}
	for i := range endpoints {
		svc.Endpoints = append(svc.Endpoints, lb.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 0, byte(i + 1)}), 8080), Ready: true, Serving: true})
	}
	return svc
}

// withEndpoints lists a Service port's frontends whose pool has endpoints,
// as a mode that serves only those would.
func withEndpoints(snap *lb.Snapshot) func(*lb.Balancer) []lb.Frontend {
	return func(bal *lb.Balancer) []lb.Frontend {
		if bal == nil {
			return nil
		}
		var out []lb.Frontend
		for fe, pool := range snap.Frontends(bal) {
			if pool != nil && len(pool.Backends()) > 0 {
				out = append(out, fe)
			}
		}
		return out
	}
}

// TestServedFresh: the first call finds every served frontend fresh; later
// ones only those that started being served (a Service added, endpoints
// 0 → n), not those that stay, move to another Service port, or stop.
func TestServedFresh(t *testing.T) {
	s := lb.NewStore(lb.StoreOptions{})
	var served conntrack.Served
	hidden := map[lb.Frontend]bool{} // what the mode cannot serve for reasons of its own
	fresh := func(snap *lb.Snapshot, err error) []lb.Frontend {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		frontends := func(bal *lb.Balancer) []lb.Frontend {
			return slices.DeleteFunc(withEndpoints(snap)(bal), func(fe lb.Frontend) bool { return hidden[fe] })
		}
		got := slices.Collect(maps.Keys(served.Fresh(snap, frontends)))
		slices.SortFunc(got, func(a, b lb.Frontend) int { return a.Addr.Compare(b.Addr) })
		return got
	}
	steps := []struct {
		name string
		snap func() (*lb.Snapshot, error)
		want []lb.Frontend
	}{
		{"first: everything served", func() (*lb.Snapshot, error) {
			return s.Replace([]lb.Service{service("a", 1, "10.96.0.1"), service("b", 0, "10.96.0.2")})
		}, []lb.Frontend{tcp("10.96.0.1:80")}},
		{"nothing changed", func() (*lb.Snapshot, error) { return s.Update(nil, nil) }, nil},
		{"b gets an endpoint", func() (*lb.Snapshot, error) { return s.Update([]lb.Service{service("b", 1, "10.96.0.2")}, nil) }, []lb.Frontend{tcp("10.96.0.2:80")}},
		{"c added, a updated", func() (*lb.Snapshot, error) {
			return s.Update([]lb.Service{service("a", 2, "10.96.0.1"), service("c", 1, "10.96.0.3")}, nil)
		}, []lb.Frontend{tcp("10.96.0.3:80")}},
		{"c's IP moves to d", func() (*lb.Snapshot, error) {
			return s.Update([]lb.Service{service("d", 1, "10.96.0.3")}, []lb.ServicePortName{{Namespace: "ns", Name: "c"}})
		}, nil},
		{"b loses its endpoints", func() (*lb.Snapshot, error) { return s.Update([]lb.Service{service("b", 0, "10.96.0.2")}, nil) }, nil},
		{"b gets them back", func() (*lb.Snapshot, error) { return s.Update([]lb.Service{service("b", 1, "10.96.0.2")}, nil) }, []lb.Frontend{tcp("10.96.0.2:80")}},
		{"d removed", func() (*lb.Snapshot, error) { return s.Update(nil, []lb.ServicePortName{{Namespace: "ns", Name: "d"}}) }, nil},
		{"d added again", func() (*lb.Snapshot, error) { return s.Update([]lb.Service{service("d", 1, "10.96.0.3")}, nil) }, []lb.Frontend{tcp("10.96.0.3:80")}},
		{"the mode stops serving a, recheck", func() (*lb.Snapshot, error) {
			hidden[tcp("10.96.0.1:80")] = true
			served.Recheck()
			return s.Update(nil, nil)
		}, nil},
		{"the mode serves a again, no recheck: not seen", func() (*lb.Snapshot, error) {
			delete(hidden, tcp("10.96.0.1:80"))
			return s.Update(nil, nil)
		}, nil},
		{"recheck", func() (*lb.Snapshot, error) { served.Recheck(); return s.Update(nil, nil) }, []lb.Frontend{tcp("10.96.0.1:80")}},
		{"reset: everything", func() (*lb.Snapshot, error) { served.Reset(); return s.Update(nil, nil) },
			[]lb.Frontend{tcp("10.96.0.1:80"), tcp("10.96.0.2:80"), tcp("10.96.0.3:80")}},
	}
	for _, st := range steps {
		if got := fresh(st.snap()); !slices.Equal(got, st.want) {
			t.Errorf("%s: fresh %v, want %v", st.name, got, st.want)
		}
	}
}

// TestClearUnNATed: only entries to a fresh frontend whose destination no
// rule rewrote go, UDP ones and TCP ones in SYN_SENT; a NodePort matches
// every address of its family; a family without fresh frontends is not
// read.
func TestClearUnNATed(t *testing.T) {
	unNATed := func(proto lb.Protocol, dst string, state conntrack.TCPState) conntrack.Flow {
		return conntrack.Flow{Proto: proto, OrigSrc: ap("198.18.0.2:40000"), OrigDst: ap(dst), ReplySrc: ap(dst), TCPState: state}
	}
	var (
		syn        = unNATed(lb.TCP, "10.96.0.1:80", conntrack.SynSent)
		open       = unNATed(lb.TCP, "10.96.0.1:80", 3)
		nated      = conntrack.Flow{Proto: lb.TCP, OrigSrc: ap("198.18.0.2:40001"), OrigDst: ap("10.96.0.1:80"), ReplySrc: ap("10.244.0.1:8080"), TCPState: conntrack.SynSent}
		otherPort  = unNATed(lb.TCP, "10.96.0.1:81", conntrack.SynSent)
		udp        = unNATed(lb.UDP, "10.96.0.10:53", 0)
		udpWrongIP = unNATed(lb.UDP, "10.96.0.11:53", 0)
		nodePort   = unNATed(lb.UDP, "192.0.2.7:30053", 0)
		syn6       = unNATed(lb.TCP, "[fd00::1]:80", conntrack.SynSent)
		tcpNode    = unNATed(lb.TCP, "192.0.2.7:30080", conntrack.SynSent) // refused by the node: no entry to clear
		other      = conntrack.Flow{Other: true, OrigDst: ap("10.96.0.1:80"), ReplySrc: ap("10.96.0.1:80"), TCPState: conntrack.SynSent}
	)
	ct := &conntracktest.Table{}
	ct.Add(netfilter.IPv4, syn, open, nated, otherPort, udp, udpWrongIP, nodePort, tcpNode, other)
	ct.Add(netfilter.IPv6, syn6)
	fresh := map[lb.Frontend]bool{
		tcp("10.96.0.1:80"):                             true,
		{Protocol: lb.UDP, Addr: ap("10.96.0.10:53")}:   true,
		{Protocol: lb.UDP, Addr: ap("0.0.0.0:30053")}:   true,
		{Protocol: lb.TCP, Addr: ap("0.0.0.0:30080")}:   true,
		{Protocol: lb.UDP, Addr: ap("10.96.0.12:5353")}: true,
	}
	n, err := conntrack.ClearUnNATed(context.Background(), ct, fresh)
	if err != nil || n != 3 {
		t.Errorf("ClearUnNATed = %d, %v; want 3 deleted", n, err)
	}
	if got, want := ct.Flows(netfilter.IPv4), []conntrack.Flow{open, nated, otherPort, udpWrongIP, tcpNode, other}; !slices.Equal(got, want) {
		t.Errorf("IPv4 left %v, want %v", got, want)
	}
	if got := ct.Flows(netfilter.IPv6); len(got) != 1 {
		t.Errorf("IPv6 left %v: no IPv6 frontend was fresh", got)
	}
	if ct.Deletes() != 1 {
		t.Errorf("%d reads of the table, want 1 (IPv4 only)", ct.Deletes())
	}

	ct.FailNext(errors.New("no ctnetlink"))
	if _, err := conntrack.ClearUnNATed(context.Background(), ct, map[lb.Frontend]bool{tcp("[fd00::1]:80"): true}); err == nil {
		t.Error("a failed read was not reported")
	}
}

// TestServedAfterShrink: after a cluster shrinks far below its peak (the
// maps are made anew), what is served and what is fresh stay right.
func TestServedAfterShrink(t *testing.T) {
	s := lb.NewStore(lb.StoreOptions{})
	var served conntrack.Served
	big := []lb.Service{service("a", 1, "10.96.0.1")}
	for i := range 3000 {
		big = append(big, service(fmt.Sprintf("s%d", i), 1, netip.AddrFrom4([4]byte{10, 97, byte(i >> 8), byte(i)}).String()))
	}
	fresh := func(snap *lb.Snapshot, err error) int {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return len(served.Fresh(snap, withEndpoints(snap)))
	}
	if n := fresh(s.Replace(big)); n != len(big) {
		t.Fatalf("first: %d fresh, want %d", n, len(big))
	}
	if n := fresh(s.Replace(big[:2])); n != 0 {
		t.Errorf("after shrinking to 2: %d fresh, want 0", n)
	}
	if n := fresh(s.Replace(big[:3])); n != 1 {
		t.Errorf("one Service back: %d fresh, want 1", n)
	}
	if n := fresh(s.Replace(big[1:3])); n != 0 {
		t.Errorf("one removed: %d fresh, want 0", n)
	}
	if n := fresh(s.Replace(big[:3])); n != 1 {
		t.Errorf("a back, after the shrink: %d fresh, want 1", n)
	}
}
