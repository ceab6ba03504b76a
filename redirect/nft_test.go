package redirect

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/conntrack/conntracktest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
	"github.com/svcproxy/svcproxy/redirect/steertable"
	"github.com/svcproxy/svcproxy/redirect/steertable/steertabletest"
)

// TestBackendChoice: auto prefers nftables, falls back to iptables, and
// fails only when neither works; a backend asked for by name does not fall
// back.
func TestBackendChoice(t *testing.T) {
	noNFT := errors.New("no nf_tables here")
	noIPTables := errors.New("iptables: not found")
	for _, tc := range []struct {
		name          string
		backend       Backend
		nft, iptables bool
		want          Backend // "": New fails
		wantIPTables  string
	}{
		{"auto, both", "", true, true, BackendNFTables, "nf_tables"},
		{"auto spelled out", BackendAuto, true, true, BackendNFTables, "nf_tables"},
		{"auto, nftables only", BackendAuto, true, false, BackendNFTables, ""},
		{"auto, iptables only", BackendAuto, false, true, BackendIPTables, "nf_tables"},
		{"auto, neither", BackendAuto, false, false, "", ""},
		{"nftables asked, missing", BackendNFTables, false, true, "", ""},
		{"nftables asked", BackendNFTables, true, false, BackendNFTables, ""},
		{"iptables asked, nftables works too", BackendIPTables, true, true, BackendIPTables, "nf_tables"},
		{"iptables asked, missing", BackendIPTables, true, false, "", ""},
		{"unknown backend", "ebpf", true, true, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, f := steertabletest.NewFake(), netfiltertest.NewFake()
			if !tc.nft {
				k.Fail("probe", noNFT)
			}
			if !tc.iptables {
				f.FailNext("iptables-version", noIPTables)
			}
			cfg := Config{Backend: tc.backend, Mark: testMark, NFT: k, Exec: f, Conntrack: &conntracktest.Table{}, Logger: zaptest.NewLogger(t)}
			r, err := New(cfg)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("New succeeded with backend %v", r.Backend())
				}
				if tc.name == "auto, neither" && (!strings.Contains(err.Error(), noNFT.Error()) || !strings.Contains(err.Error(), noIPTables.Error())) {
					t.Errorf("error %q does not give both reasons", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if r.Backend() != tc.want || r.IPTables() != tc.wantIPTables {
				t.Errorf("Backend() = %v, IPTables() = %q; want %v, %q", r.Backend(), r.IPTables(), tc.want, tc.wantIPTables)
			}
			if !strings.Contains(r.Describe(), string(tc.want)) {
				t.Errorf("Describe() = %q does not name %v", r.Describe(), tc.want)
			}
		})
	}
}

// TestNFTIncremental checks that a change writes only the elements of the
// Service ports that changed, in one transaction per family touched, and
// nothing when nothing changed.
func TestNFTIncremental(t *testing.T) {
	ctx := context.Background()
	r, k, _ := newFakeNFTRedirector(t, Config{IPv6: true})
	st := store(t, testServices()...)
	ports := testPorts()
	mustApply(t, r, st.Snapshot(), ports, true)
	if n := k.Count("setup"); n != 2 {
		t.Errorf("full sync: %d setups, want one per family", n)
	}
	step := func(name string, wantUpdates int, upserts []lb.Service, deletes ...string) {
		t.Helper()
		var names []lb.ServicePortName
		for _, d := range deletes {
			names = append(names, svcName(d))
		}
		snap, err := st.Update(upserts, names)
		if err != nil {
			t.Fatalf("%s: Update: %v", name, err)
		}
		setups, updates, reads := k.Count("setup"), k.Count("update"), k.Count("elements")
		if err := r.Apply(ctx, snap, ports, false); err != nil {
			t.Fatalf("%s: Apply: %v", name, err)
		}
		if n := k.Count("update") - updates; n != wantUpdates {
			t.Errorf("%s: %d transactions, want %d", name, n, wantUpdates)
		}
		if k.Count("setup") != setups || k.Count("elements") != reads {
			t.Errorf("%s: an incremental Apply rewrote rules or read the table back", name)
		}
	}
	svcs := testServices()
	step("nothing changed", 0, nil)

	empty := svcs[3]
	empty.Endpoints = eps(1, "node-b")
	step("endpoints appear (ClusterIP in IPv4, NodePort in both)", 2, []lb.Service{empty})
	checkTrace(t, k, pkt(lb.TCP, "10.96.0.12:80", netfiltertest.Prerouting), redirected(testTCPPort))
	checkTrace(t, k, pkt(lb.TCP, "192.0.2.10:30082", netfiltertest.Prerouting), redirected(testTCPPort))
	checkTrace(t, k, pkt(lb.TCP, "[2001:db8::10]:30082", netfiltertest.Prerouting), redirected(testTCPPort))

	moved := empty
	moved.Endpoints = eps(2, "node-b")
	step("endpoints change but stay usable: same elements", 0, []lb.Service{moved})

	dns := svcs[2]
	dns.Endpoints = nil
	step("UDP endpoints go", 2, []lb.Service{dns})
	checkTrace(t, k, pkt(lb.UDP, "10.96.0.53:53", netfiltertest.Prerouting), rejected)
	checkTrace(t, k, pkt(lb.UDP, "192.0.2.10:30053", netfiltertest.Prerouting), rejected)
	checkTrace(t, k, pkt(lb.UDP, "192.0.2.10:40053", netfiltertest.Prerouting), dropped)

	step("UDP endpoints come back", 2, []lb.Service{svcs[2]})
	checkTrace(t, k, pkt(lb.UDP, "10.96.0.53:53", netfiltertest.Prerouting), redirected(40053))
	checkTrace(t, k, pkt(lb.UDP, "[2001:db8::10]:30053", netfiltertest.Prerouting), redirected(40055))

	added := lb.Service{Name: svcName("added"), Port: 443, ClusterIPs: []netip.Addr{ip("10.96.1.1")}, Endpoints: eps(3, "")}
	step("TCP Service added: IPv4 only", 1, []lb.Service{added})
	checkTrace(t, k, pkt(lb.TCP, "10.96.1.1:443", netfiltertest.Prerouting), redirected(testTCPPort))
	// 7: web's 3 IPv4 ones, local's ClusterIP, dns, empty and added;
	// local's LB IP is in the short circuit's map (and no-endpoints).
	if n := k.Len(netfilter.IPv4, steertable.SetFrontends); n != 7 {
		t.Errorf("frontends map holds %d elements, want 7", n)
	}
	if n := k.Len(netfilter.IPv4, steertable.SetShortCircuit); n != 1 {
		t.Errorf("short-circuit map holds %d elements, want 1", n)
	}

	step("TCP Service removed", 1, nil, "added")
	checkTrace(t, k, pkt(lb.TCP, "10.96.1.1:443", netfiltertest.Prerouting), accepted)

	step("Service with a NodePort and an IPv6 ClusterIP removed", 2, nil, "web")
	for _, dst := range []string{"10.96.0.10:80", "203.0.113.10:80", "203.0.113.20:80", "192.0.2.10:30080", "[fd00::10]:80", "[2001:db8::10]:30080"} {
		checkTrace(t, k, pkt(lb.TCP, dst, netfiltertest.Prerouting), accepted)
	}

	udp := lb.Service{Name: svcName("dns2"), Protocol: lb.UDP, Port: 53, ClusterIPs: []netip.Addr{ip("10.96.0.99")}, Endpoints: eps(1, "")}
	step("UDP Service added", 1, []lb.Service{udp})
	checkTrace(t, k, pkt(lb.UDP, "10.96.0.99:53", netfiltertest.Prerouting), redirected(40057))
	checkTrace(t, k, pkt(lb.UDP, "192.0.2.10:40057", netfiltertest.Prerouting), dropped)

	// New ports: a full sync, rewriting every map value.
	ports.TCP = 15002
	if err := r.Apply(ctx, st.Snapshot(), ports, false); err != nil {
		t.Fatal(err)
	}
	checkTrace(t, k, pkt(lb.TCP, "10.96.0.11:80", netfiltertest.Output), redirected(15002))
	if r.Repairs() != 0 {
		t.Errorf("Repairs = %d without tampering", r.Repairs())
	}
	// A full sync finds exactly what the incremental ones wrote.
	updates := k.Count("update")
	mustApply(t, r, st.Snapshot(), ports, true)
	if r.Repairs() != 0 || k.Count("update") != updates {
		t.Errorf("a clean full sync repaired (%d) or wrote (%d transactions)", r.Repairs(), k.Count("update")-updates)
	}
	// And a from-scratch Redirector's elements equal the incremental ones.
	fresh, k2, _ := newFakeNFTRedirector(t, Config{IPv6: true})
	mustApply(t, fresh, st.Snapshot(), ports, true)
	if got, want := k.Dump(), k2.Dump(); got != want {
		t.Errorf("incremental syncs left:\n%s\nfrom scratch:\n%s", got, want)
	}
}

// TestNFTRepair: a full Apply restores a tampered table and counts it; a
// failed transaction is counted and the next Apply is a full one.
func TestNFTRepair(t *testing.T) {
	ctx := context.Background()
	r, k, _ := newFakeNFTRedirector(t, Config{IPv6: true})
	st := store(t, testServices()...)
	snap := st.Snapshot()
	mustApply(t, r, snap, testPorts(), true)
	mustApply(t, r, snap, testPorts(), true)
	if r.Repairs() != 0 {
		t.Fatalf("Repairs = %d after a clean full sync", r.Repairs())
	}
	for i, tamper := range []struct {
		fam netfilter.Family
		set string
	}{{netfilter.IPv4, steertable.SetFrontends}, {netfilter.IPv6, ""}, {netfilter.IPv4, steertable.SetUDPSockets}} {
		k.Tamper(tamper.fam, tamper.set)
		mustApply(t, r, snap, testPorts(), false) // incremental: trusts what it wrote
		mustApply(t, r, snap, testPorts(), true)
		if got := r.Repairs(); got != uint64(i+1) {
			t.Errorf("tampering with %v %q: Repairs = %d, want %d", tamper.fam, tamper.set, got, i+1)
		}
		checkTrace(t, k, pkt(lb.TCP, "10.96.0.10:80", netfiltertest.Prerouting), redirected(testTCPPort))
		checkTrace(t, k, pkt(lb.TCP, "[2001:db8::10]:30080", netfiltertest.Prerouting), redirected(testTCPPort))
		checkTrace(t, k, pkt(lb.UDP, "192.0.2.10:40053", netfiltertest.Prerouting), dropped)
	}

	boom := errors.New("boom")
	k.Fail("update", boom)
	svcs := testServices()
	svcs[3].Endpoints = eps(1, "")
	snap, _ = st.Update([]lb.Service{svcs[3]}, nil)
	if err := r.Apply(ctx, snap, testPorts(), false); !errors.Is(err, boom) {
		t.Fatalf("Apply = %v, want boom", err)
	}
	if r.SyncFailures(netfilter.IPv4) == 0 {
		t.Error("a failed transaction was not counted")
	}
	k.Fail("update", nil)
	setups := k.Count("setup")
	repairs := r.Repairs()
	mustApply(t, r, snap, testPorts(), false)
	if k.Count("setup") == setups {
		t.Error("the Apply after a failure was not a full one")
	}
	if r.Repairs() != repairs {
		t.Error("the full sync after a failure counted a repair")
	}
	checkTrace(t, k, pkt(lb.TCP, "10.96.0.12:80", netfiltertest.Prerouting), redirected(testTCPPort))
}

// TestNFTSteeredUDP: a new Redirector reads the ports the UDP frontends are
// redirected to from the table a previous one left.
func TestNFTSteeredUDP(t *testing.T) {
	ctx := context.Background()
	r, k, f := newFakeNFTRedirector(t, Config{IPv6: true})
	mustApply(t, r, store(t, testServices()...).Snapshot(), testPorts(), true)
	next, err := New(Config{Backend: BackendNFTables, Mark: testMark, IPv6: true, NFT: k, Exec: f, Conntrack: &conntracktest.Table{}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := next.SteeredUDP(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[lb.Frontend]uint16{ // UDP frontends with endpoints and a socket
		{Protocol: lb.UDP, Addr: ap("10.96.0.53:53")}: 40053,
		{Protocol: lb.UDP, Addr: ap("0.0.0.0:30053")}: 40054,
		{Protocol: lb.UDP, Addr: ap("[::]:30053")}:    40055,
	}
	if !maps.Equal(got, want) {
		t.Errorf("SteeredUDP = %v, want %v", got, want)
	}
}

// TestBackendSwitch: each backend's first Apply removes what the other left,
// so two sets of rules never steer at once, and Cleanup removes both.
func TestBackendSwitch(t *testing.T) {
	ctx := context.Background()
	k, f := steertabletest.NewFake(), netfiltertest.NewFake()
	empty := f.Dump()
	snap := store(t, testServices()...).Snapshot()
	newWith := func(b Backend) *Redirector {
		r, err := New(Config{Backend: b, Mark: testMark, IPv6: true, NFT: k, Exec: f, Conntrack: &conntracktest.Table{}, Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	mustApply(t, newWith(BackendIPTables), snap, testPorts(), true)
	mustApply(t, newWith(BackendNFTables), snap, testPorts(), true)
	if f.Dump() != empty {
		t.Errorf("the nftables backend left the iptables backend's rules:\n%s", f.Dump())
	}
	checkTrace(t, k, pkt(lb.TCP, "10.96.0.10:80", netfiltertest.Prerouting), redirected(testTCPPort))
	mustApply(t, newWith(BackendIPTables), snap, testPorts(), true)
	if k.Has(netfilter.IPv4) || k.Has(netfilter.IPv6) {
		t.Errorf("the iptables backend left the nftables tables:\n%s", k.Dump())
	}
	checkTrace(t, f, pkt(lb.TCP, "10.96.0.10:80", netfiltertest.Prerouting), redirected(testTCPPort))

	mustApply(t, newWith(BackendNFTables), snap, testPorts(), true)
	if err := newWith(BackendNFTables).Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if k.Has(netfilter.IPv4) || k.Has(netfilter.IPv6) || f.Dump() != empty {
		t.Errorf("Cleanup left:\n%s\n%s", k.Dump(), f.Dump())
	}
}

// TestBackendSwitchOrder: a node switching steering backends is never
// without steering: the other backend's rules go only once this one's
// are written, and a removal that fails is retried at the next full sync.
func TestBackendSwitchOrder(t *testing.T) {
	snap := store(t, testServices()...).Snapshot()
	vip := pkt(lb.TCP, "10.96.0.10:80", netfiltertest.Prerouting)
	steers := func(tr tracer) bool { return tr.Trace(vip).Action == netfiltertest.Redirect }

	t.Run("iptables to nftables", func(t *testing.T) {
		f, k := netfiltertest.NewFake(), steertabletest.NewFake()
		mustApply(t, newRedirector(t, Config{Backend: BackendIPTables, Exec: f, NFT: k, IPv6: true}), snap, testPorts(), true)
		removals := 0
		// The nftables backend runs iptables-restore only to remove.
		exec := checkedExec{Executor: f, restore: func() {
			removals++
			if !steers(k) {
				t.Error("the iptables rules were removed before the nftables table steered")
			}
		}}
		mustApply(t, newRedirector(t, Config{Backend: BackendNFTables, Exec: exec, NFT: k, IPv6: true}), snap, testPorts(), true)
		if removals == 0 || steers(f) {
			t.Errorf("the iptables rules were not removed (%d removals)", removals)
		}
	})

	t.Run("nftables to iptables, a failed removal retried", func(t *testing.T) {
		f, k := netfiltertest.NewFake(), steertabletest.NewFake()
		mustApply(t, newRedirector(t, Config{Backend: BackendNFTables, Exec: f, NFT: k, IPv6: true}), snap, testPorts(), true)
		boom := errors.New("boom")
		checked := checkedKernel{Kernel: k, delete: func() {
			if !steers(f) {
				t.Error("the nftables table was removed before the iptables rules steered")
			}
		}}
		k.Fail("delete", boom)
		r := newRedirector(t, Config{Backend: BackendIPTables, Exec: f, NFT: checked, IPv6: true})
		mustApply(t, r, snap, testPorts(), true)
		if !k.Has(netfilter.IPv4) {
			t.Fatal("the table went although its removal failed")
		}
		k.Fail("delete", nil)
		mustApply(t, r, snap, testPorts(), false)
		if !k.Has(netfilter.IPv4) {
			t.Error("an incremental sync removed the table (only full syncs retry)")
		}
		mustApply(t, r, snap, testPorts(), true)
		if k.Has(netfilter.IPv4) || k.Has(netfilter.IPv6) {
			t.Error("the next full sync did not retry removing the nftables table")
		}
	})
}

// checkedExec calls restore before each iptables-restore.
type checkedExec struct {
	netfilter.Executor
	restore func()
}

func (c checkedExec) IPTablesRestore(ctx context.Context, family netfilter.Family, data []byte) error {
	c.restore()
	return c.Executor.IPTablesRestore(ctx, family, data)
}

// checkedKernel calls delete before each table deletion.
type checkedKernel struct {
	steertable.Kernel
	delete func()
}

func (c checkedKernel) Delete(ctx context.Context, fam netfilter.Family) error {
	c.delete()
	return c.Kernel.Delete(ctx, fam)
}

// TestAutoProbesTheDNAT: auto's nftables probe writes the table as it
// will be, a DNAT to the node address included: a kernel that redirects
// but cannot DNAT in nf_tables gets the iptables backend, not a table
// whose every write fails.
func TestAutoProbesTheDNAT(t *testing.T) {
	k := noDNATKernel{steertabletest.NewFake()}
	for _, tc := range []struct {
		nodeIPs []netip.Addr
		want    Backend
	}{
		{nil, BackendNFTables},
		{[]netip.Addr{nodeIP}, BackendIPTables},
	} {
		r := newRedirector(t, Config{Backend: BackendAuto, Exec: netfiltertest.NewFake(), NFT: k, NodeIPs: tc.nodeIPs})
		if r.Backend() != tc.want {
			t.Errorf("node IPs %v: backend %v, want %v", tc.nodeIPs, r.Backend(), tc.want)
		}
	}
}

// noDNATKernel cannot write a table that DNATs.
type noDNATKernel struct{ steertable.Kernel }

func (k noDNATKernel) Probe(ctx context.Context, l steertable.Layout) error {
	if l.To.IsValid() {
		return errors.New("nat expression not supported")
	}
	return k.Kernel.Probe(ctx, l)
}
