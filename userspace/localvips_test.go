package userspace

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/forwarder"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs/ipvstest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/redirect"
)

// localMode is a userspace mode steering locally through links (the fake).
// Its frontends' addresses are not the host's, so the forwarder cannot
// bind them: it logs that and the test looks at the device alone.
func localMode(t *testing.T, links Links) *Mode {
	t.Helper()
	return localModeIPv6(t, links, true)
}

func localModeIPv6(t *testing.T, links Links, ipv6 bool) *Mode {
	t.Helper()
	m, err := New(Config{
		Forwarder: forwarder.Config{Workers: 1, Mark: -1, DrainTimeout: time.Second, Logger: zaptest.NewLogger(t)},
		LocalVIPs: &LocalVIPs{Links: links, IPv6: ipv6},
		Logger:    zaptest.NewLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

// snapshotOf is store's snapshot of svcs.
func snapshotOf(t *testing.T, store *lb.Store, svcs ...lb.Service) *lb.Snapshot {
	t.Helper()
	snap, err := store.Replace(svcs)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// webAt is a TCP Service on port 80 of ips, without endpoints.
func webAt(ips ...string) lb.Service {
	return lb.Service{Name: lb.ServicePortName{Namespace: "ns", Name: "web"}, Protocol: lb.TCP, Port: 80, ClusterIPs: addrs(ips...)}
}

// onDevice is what the fake holds on DefaultVIPDevice, sorted; ok false
// when the device does not exist.
func onDevice(links *ipvstest.Links) (got []netip.Addr, kind string, ok bool) {
	kind, got, ok = links.Link(DefaultVIPDevice)
	slices.SortFunc(got, netip.Addr.Compare)
	return got, kind, ok
}

// TestLocalVIPs: local steering keeps the dummy interface holding exactly
// the virtual IPs of the snapshot's TCP and UDP frontends (not loopback
// ones, not SCTP-only ones, not the node's own), changes only what
// changed, puts back on a full sync what someone removed, retries what it
// could not add without failing the sync, keeps the device for a
// successor and removes it on a last Close.
func TestLocalVIPs(t *testing.T) {
	ctx := context.Background()
	links := ipvstest.NewLinks()
	links.AddNodeAddr("eth0", netip.MustParseAddr("198.18.0.1"))
	m := localMode(t, links)
	store := lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: "node-a"}})
	ep := []lb.Endpoint{{Addr: netip.MustParseAddrPort("127.0.0.1:9"), Ready: true, Serving: true}}
	web := lb.Service{Name: lb.ServicePortName{Namespace: "ns", Name: "web"}, Protocol: lb.TCP, Port: 80,
		ClusterIPs: addrs("198.18.5.1", "2001:db8::1"), ExternalIPs: addrs("198.18.5.2", "198.18.0.1"), LoadBalancerIPs: addrs("198.18.5.3", "169.254.5.3"), Endpoints: ep}
	dns := lb.Service{Name: lb.ServicePortName{Namespace: "ns", Name: "dns"}, Protocol: lb.UDP, Port: 53,
		ClusterIPs: addrs("198.18.5.4"), Endpoints: ep}
	empty := lb.Service{Name: lb.ServicePortName{Namespace: "ns", Name: "empty"}, Protocol: lb.TCP, Port: 80,
		ClusterIPs: addrs("198.18.5.5")}
	sctp := lb.Service{Name: lb.ServicePortName{Namespace: "ns", Name: "sctp"}, Protocol: lb.SCTP, Port: 80,
		ClusterIPs: addrs("198.18.5.6"), Endpoints: ep}
	static := lb.Service{Name: lb.ServicePortName{Namespace: "ns", Name: "static"}, Protocol: lb.TCP, Port: 18080,
		ClusterIPs: addrs("127.0.0.1"), Endpoints: ep}
	apply := func(full bool, svcs ...lb.Service) error {
		t.Helper()
		return m.Apply(ctx, snapshotOf(t, store, svcs...), full)
	}
	want := func(step string, a ...string) {
		t.Helper()
		got, kind, ok := onDevice(links)
		if !ok {
			t.Fatalf("%s: no %s device", step, DefaultVIPDevice)
		}
		if kind != "dummy" {
			t.Errorf("%s: %s is a %s, want a dummy", step, DefaultVIPDevice, kind)
		}
		w := addrs(a...)
		slices.SortFunc(w, netip.Addr.Compare)
		if !slices.Equal(got, w) {
			t.Errorf("%s: on the device %v, want %v", step, got, w)
		}
	}

	if err := apply(false, web, dns, empty, sctp, static); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	want("first", "169.254.5.3", "198.18.5.1", "198.18.5.2", "198.18.5.3", "198.18.5.4", "198.18.5.5", "2001:db8::1")

	links.ResetCalls()
	web.ExternalIPs, web.LoadBalancerIPs = nil, addrs("198.18.5.3")
	if err := apply(false, web, dns, empty, sctp, static); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	want("ExternalIP removed", "198.18.5.1", "198.18.5.3", "198.18.5.4", "198.18.5.5", "2001:db8::1")
	if calls := links.Calls(); !slices.Equal(calls, []string{"DelAddr " + DefaultVIPDevice + " 169.254.5.3", "DelAddr " + DefaultVIPDevice + " 198.18.5.2"}) {
		t.Errorf("two addresses removed: calls %q, want their two DelAddrs", calls)
	}

	// Someone removes an address: an incremental sync does not look, a
	// full one puts it back.
	if err := links.DelAddr(ctx, DefaultVIPDevice, netip.MustParseAddr("198.18.5.4")); err != nil {
		t.Fatal(err)
	}
	if err := apply(false, web, dns, empty, sctp, static); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	want("removed by someone, incremental sync", "198.18.5.1", "198.18.5.3", "198.18.5.5", "2001:db8::1")
	if err := apply(true, web, dns, empty, sctp, static); err != nil {
		t.Fatalf("full Apply: %v", err)
	}
	want("removed by someone, full sync", "198.18.5.1", "198.18.5.3", "198.18.5.4", "198.18.5.5", "2001:db8::1")

	// An address that cannot be added is left for the next sync, which
	// adds it; the rest are added, and the sync does not fail (it would
	// hold back /healthz and a handover for one frontend).
	links.FailNext("AddAddr", errors.New("no buffer space"))
	web.ExternalIPs = addrs("198.18.5.7", "198.18.5.8")
	if err := apply(false, web, dns, empty, sctp, static); err != nil {
		t.Fatalf("Apply with AddAddr failing once: %v, want nil (logged, retried)", err)
	}
	want("one add failed", "198.18.5.1", "198.18.5.3", "198.18.5.4", "198.18.5.5", "198.18.5.8", "2001:db8::1")
	if n, failed := m.LocalVIPs(); n != 6 || failed != 1 {
		t.Errorf("LocalVIPs() = %d addresses, %d failures; want 6, 1", n, failed)
	}
	if err := apply(false, web, dns, empty, sctp, static); err != nil {
		t.Fatalf("retry: %v", err)
	}
	want("retried", "198.18.5.1", "198.18.5.3", "198.18.5.4", "198.18.5.5", "198.18.5.7", "198.18.5.8", "2001:db8::1")

	// Handed over: the device stays for the successor, which adopts it
	// and removes what its snapshot no longer has.
	if err := m.Close(ctx, true); err != nil {
		t.Fatalf("Close(handedOver): %v", err)
	}
	want("handed over", "198.18.5.1", "198.18.5.3", "198.18.5.4", "198.18.5.5", "198.18.5.7", "198.18.5.8", "2001:db8::1")
	m = localMode(t, links)
	if err := apply(false, dns); err != nil {
		t.Fatalf("successor's Apply: %v", err)
	}
	want("successor", "198.18.5.4")
	if err := m.Close(ctx, false); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got, _, ok := onDevice(links); ok {
		t.Errorf("after the last Close the device is still there with %v", got)
	}
	if n, _ := m.LocalVIPs(); n != 0 {
		t.Errorf("LocalVIPs() after the last Close: %d addresses, want 0", n)
	}
}

// TestLocalVIPsNoIPv6: on a node without IPv6 a dual-stack Service's IPv6
// addresses are left off the device (they could not be added) and the
// sync succeeds.
func TestLocalVIPsNoIPv6(t *testing.T) {
	ctx := context.Background()
	links := ipvstest.NewLinks()
	m := localModeIPv6(t, links, false)
	defer m.Close(ctx, false)
	if err := m.Apply(ctx, snapshotOf(t, lb.NewStore(lb.StoreOptions{}), webAt("198.18.5.1", "2001:db8::1")), true); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if got, _, _ := onDevice(links); !slices.Equal(got, addrs("198.18.5.1")) {
		t.Errorf("on the device %v, want only 198.18.5.1", got)
	}
}

// TestLocalVIPsHandedOver: once the mode has stopped accepting (its
// successor serves), an Apply leaves the device alone, and Close leaves
// it to the successor.
func TestLocalVIPsHandedOver(t *testing.T) {
	ctx := context.Background()
	links := ipvstest.NewLinks()
	m := localMode(t, links)
	store := lb.NewStore(lb.StoreOptions{})
	if err := m.Apply(ctx, snapshotOf(t, store, webAt("198.18.5.1")), false); err != nil {
		t.Fatal(err)
	}
	m.StopAccepting()
	links.ResetCalls()
	// The old process's view, lagging the successor's.
	if err := m.Apply(ctx, snapshotOf(t, store), true); err != nil {
		t.Fatalf("Apply after StopAccepting: %v", err)
	}
	if err := m.Close(ctx, true); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if calls := links.Calls(); len(calls) != 0 {
		t.Errorf("after StopAccepting the mode still called %q", calls)
	}
	if got, _, _ := onDevice(links); !slices.Equal(got, addrs("198.18.5.1")) {
		t.Errorf("on the device %v, want 198.18.5.1 kept for the successor", got)
	}
}

// TestLocalVIPsDeviceGone: a full sync recreates a device someone deleted;
// Cleanup deletes it.
func TestLocalVIPsDeviceGone(t *testing.T) {
	ctx := context.Background()
	links := ipvstest.NewLinks()
	m := localMode(t, links)
	defer m.Close(ctx, true)
	snap := snapshotOf(t, lb.NewStore(lb.StoreOptions{}), webAt("198.18.5.1"))
	if err := m.Apply(ctx, snap, false); err != nil {
		t.Fatal(err)
	}
	if err := links.DeleteLink(ctx, DefaultVIPDevice); err != nil {
		t.Fatal(err)
	}
	if err := m.Apply(ctx, snap, true); err != nil {
		t.Fatalf("full Apply after the device was deleted: %v", err)
	}
	if got, _, ok := onDevice(links); !ok || !slices.Equal(got, addrs("198.18.5.1")) {
		t.Errorf("after the full Apply: device %v with %v, want 198.18.5.1 on it", ok, got)
	}
	if err := m.Cleanup(ctx); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if _, _, ok := onDevice(links); ok {
		t.Error("the device is still there after Cleanup")
	}
}

// TestLocalAndRedirectExclusive: one steering at a time.
func TestLocalAndRedirectExclusive(t *testing.T) {
	_, err := New(Config{
		Forwarder: forwarder.Config{Workers: 1, Mark: -1},
		Steering:  &redirect.Config{},
		LocalVIPs: &LocalVIPs{Links: ipvstest.NewLinks()},
	})
	if err == nil || !strings.Contains(err.Error(), "exclusive") {
		t.Fatalf("New with both steerings: %v, want an error", err)
	}
}
