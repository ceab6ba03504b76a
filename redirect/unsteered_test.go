package redirect

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/conntrack/conntracktest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// TestClearUnsteered: once a frontend is steered (at the first sync, when
// its Service is added, when it gets endpoints), the conntrack entries of
// packets that reached it unsteered are deleted, those that would keep a
// flow unsteered: UDP flows, and TCP SYNs that went nowhere. Steered
// entries, established connections, other ports and frontends without
// endpoints are left alone, and a sync that steers nothing new reads no
// conntrack table.
func TestClearUnsteered(t *testing.T) {
	const dnsPort = 40053
	node := ap("198.18.0.1:15001")
	synSent := func(dst string) conntrack.Flow {
		d := ap(dst)
		return conntrack.Flow{Proto: lb.TCP, OrigSrc: ap("198.18.0.2:40000"), OrigDst: d, ReplySrc: d, TCPState: conntrack.SynSent}
	}
	var (
		webSyn      = synSent("198.18.10.1:80")
		webSyn6     = synSent("[fd00:10::1]:80")
		webSteered  = conntrack.Flow{Proto: lb.TCP, OrigSrc: ap("198.18.0.2:40001"), OrigDst: ap("198.18.10.1:80"), ReplySrc: node, TCPState: conntrack.SynSent}
		webOpen     = conntrack.Flow{Proto: lb.TCP, OrigSrc: ap("198.18.0.2:40002"), OrigDst: ap("198.18.10.1:80"), ReplySrc: ap("198.18.10.1:80"), TCPState: 3}
		webOtherSyn = synSent("198.18.10.1:81")
		deadSyn     = synSent("198.18.10.2:80")
		dnsFlow     = conntrack.Flow{Proto: lb.UDP, OrigSrc: ap("198.18.0.2:5353"), OrigDst: ap("198.18.10.53:53"), ReplySrc: ap("198.18.10.53:53")}
	)
	web := lb.Service{Name: svcName("web"), Port: 80, Endpoints: eps(1, ""), ClusterIPs: []netip.Addr{ip("198.18.10.1"), ip("fd00:10::1")}}
	dead := lb.Service{Name: svcName("dead"), Port: 80, ClusterIPs: []netip.Addr{ip("198.18.10.2")}}
	dns := lb.Service{Name: svcName("dns"), Protocol: lb.UDP, Port: 53, Endpoints: eps(1, ""), ClusterIPs: []netip.Addr{ip("198.18.10.53")}}
	ports := Ports{TCP: testTCPPort, UDP: map[lb.Frontend]uint16{{Protocol: lb.UDP, Addr: ap("198.18.10.53:53")}: dnsPort}}

	for _, backend := range []Backend{BackendIPTables, BackendNFTables} {
		t.Run(string(backend), func(t *testing.T) {
			dead := dead // given endpoints below
			ct := &conntracktest.Table{}
			var r *Redirector
			if backend == BackendNFTables {
				r, _, _ = newFakeNFTRedirector(t, Config{IPv6: true, Conntrack: ct})
			} else {
				r, _ = newFakeRedirector(t, Config{IPv6: true, Conntrack: ct})
			}
			s := store(t, web, dead, dns)
			left := func(fam netfilter.Family, want ...conntrack.Flow) {
				t.Helper()
				if got := ct.Flows(fam); !slices.Equal(got, want) {
					t.Errorf("%v entries left: %v, want %v", fam, got, want)
				}
			}

			// The first sync steers every frontend with endpoints.
			ct.Add(netfilter.IPv4, webSyn, webSteered, webOpen, webOtherSyn, deadSyn, dnsFlow)
			ct.Add(netfilter.IPv6, webSyn6)
			mustApply(t, r, s.Snapshot(), ports, true)
			left(netfilter.IPv4, webSteered, webOpen, webOtherSyn, deadSyn)
			left(netfilter.IPv6)

			// Nothing newly steered: no table read, even on a full sync.
			ct.Add(netfilter.IPv4, webSyn, dnsFlow)
			reads := ct.Deletes()
			mustApply(t, r, s.Snapshot(), ports, false)
			mustApply(t, r, s.Snapshot(), ports, true)
			if ct.Deletes() != reads {
				t.Errorf("syncs that steered nothing new read the conntrack table %d times", ct.Deletes()-reads)
			}

			// dead gets an endpoint: its frontend is steered now.
			dead.Endpoints = eps(1, "")
			if _, err := s.Update([]lb.Service{dead}, nil); err != nil {
				t.Fatal(err)
			}
			mustApply(t, r, s.Snapshot(), ports, false)
			left(netfilter.IPv4, webSteered, webOpen, webOtherSyn, webSyn, dnsFlow)

			// web loses its endpoints, then gets them back: steered again,
			// its unsteered SYN goes. A failed read is logged; the sync
			// stands.
			noEndpoints := web
			noEndpoints.Endpoints = nil
			if _, err := s.Update([]lb.Service{noEndpoints}, nil); err != nil {
				t.Fatal(err)
			}
			mustApply(t, r, s.Snapshot(), ports, false)
			if _, err := s.Update([]lb.Service{web}, nil); err != nil {
				t.Fatal(err)
			}
			ct.FailNext(errors.New("no ctnetlink"))
			mustApply(t, r, s.Snapshot(), ports, false)
			left(netfilter.IPv4, webSteered, webOpen, webOtherSyn, webSyn, dnsFlow)
			if _, err := s.Update([]lb.Service{noEndpoints}, nil); err != nil {
				t.Fatal(err)
			}
			mustApply(t, r, s.Snapshot(), ports, false)
			if _, err := s.Update([]lb.Service{web}, nil); err != nil {
				t.Fatal(err)
			}
			mustApply(t, r, s.Snapshot(), ports, false)
			left(netfilter.IPv4, webSteered, webOpen, webOtherSyn, dnsFlow)
			if got := r.UnservedCleared(); got != 5 { // 3 at the first sync, dead's SYN, web's again
				t.Errorf("UnservedCleared = %d, want 5", got)
			}
		})
	}
}

// TestClearUnsteeredWhenSocketOpens: a UDP frontend whose forwarder socket
// could not be opened is not steered; when it opens at a later sync of the
// same snapshot, the frontend's unsteered flows are cleared then.
func TestClearUnsteeredWhenSocketOpens(t *testing.T) {
	dnsFlow := conntrack.Flow{Proto: lb.UDP, OrigSrc: ap("198.18.0.2:5353"), OrigDst: ap("198.18.10.53:53"), ReplySrc: ap("198.18.10.53:53")}
	dns := lb.Service{Name: svcName("dns"), Protocol: lb.UDP, Port: 53, Endpoints: eps(1, ""), ClusterIPs: []netip.Addr{ip("198.18.10.53")}}
	for _, backend := range []Backend{BackendIPTables, BackendNFTables} {
		t.Run(string(backend), func(t *testing.T) {
			ct := &conntracktest.Table{}
			var r *Redirector
			if backend == BackendNFTables {
				r, _, _ = newFakeNFTRedirector(t, Config{Conntrack: ct})
			} else {
				r, _ = newFakeRedirector(t, Config{Conntrack: ct})
			}
			snap := store(t, dns).Snapshot()
			if err := r.Apply(context.Background(), snap, Ports{TCP: testTCPPort}, true); err == nil {
				t.Fatal("a UDP frontend without a forwarder socket was not reported")
			}
			ct.Add(netfilter.IPv4, dnsFlow)
			mustApply(t, r, snap, Ports{TCP: testTCPPort, UDP: map[lb.Frontend]uint16{{Protocol: lb.UDP, Addr: ap("198.18.10.53:53")}: 40053}}, false)
			if left := ct.Flows(netfilter.IPv4); len(left) != 0 {
				t.Errorf("entries left once the socket opened: %v", left)
			}
		})
	}
}
