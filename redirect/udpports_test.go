package redirect

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/conntrack/conntracktest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
	"github.com/svcproxy/svcproxy/redirect/steertable/steertabletest"
)

// steeredFlows puts into a new table one redirected UDP flow to each
// frontend TestUDPPortsStable steers (a NodePort's at one node address).
func steeredFlows() (*conntracktest.Table, []conntrack.Flow) {
	flows := []conntrack.Flow{
		{Proto: lb.UDP, OrigSrc: ap("10.244.0.9:5000"), OrigDst: ap("10.96.0.53:53"), ReplySrc: ap("10.244.0.1:40053")},
		{Proto: lb.UDP, OrigSrc: ap("10.244.0.9:5001"), OrigDst: ap("192.0.2.10:30053"), ReplySrc: ap("192.0.2.10:40054")},
		{Proto: lb.UDP, OrigSrc: ap("[fd00:244::9]:5002"), OrigDst: ap("[2001:db8::10]:30053"), ReplySrc: ap("[2001:db8::10]:40055")},
		{Proto: lb.UDP, OrigSrc: ap("10.244.0.9:5003"), OrigDst: ap("10.96.0.13:53"), ReplySrc: ap("10.244.0.1:40056")},
	}
	ct := &conntracktest.Table{}
	for _, f := range flows {
		ct.Add(familyOf(f.OrigDst.Addr()), f)
	}
	return ct, flows
}

// deletedFlows lists where the flows ct no longer holds were sent, sorted,
// and puts them back.
func deletedFlows(ct *conntracktest.Table, flows []conntrack.Flow) []string {
	var out []string
	for _, f := range flows {
		fam := familyOf(f.OrigDst.Addr())
		if !slices.Contains(ct.Flows(fam), f) {
			out = append(out, f.OrigDst.String())
			ct.Add(fam, f)
		}
	}
	slices.Sort(out)
	return out
}

// TestUDPPortsStable: the ports UDP frontends are redirected to survive a
// restart (a new Redirector reads them back), and a frontend that moves or
// goes loses its conntrack entries (a NodePort's at every node address),
// which would otherwise keep sending its flows to the old port.
func TestUDPPortsStable(t *testing.T) {
	ctx := context.Background()
	ct, flows := steeredFlows()
	r, _ := newFakeRedirector(t, Config{IPv6: true, Conntrack: ct})
	snap := store(t, testServices()...).Snapshot()
	ports := testPorts()
	mustApply(t, r, snap, ports, true)
	if got := deletedFlows(ct, flows); len(got) != 0 {
		t.Errorf("first Apply on a clean node deleted conntrack entries: %v", got)
	}

	steered := func(r *Redirector) map[lb.Frontend]uint16 {
		t.Helper()
		got, err := r.SteeredUDP(ctx)
		if err != nil {
			t.Fatalf("SteeredUDP: %v", err)
		}
		return got
	}
	want := map[lb.Frontend]uint16{
		{Protocol: lb.UDP, Addr: ap("10.96.0.53:53")}: 40053,
		{Protocol: lb.UDP, Addr: ap("0.0.0.0:30053")}: 40054,
		{Protocol: lb.UDP, Addr: ap("[::]:30053")}:    40055,
		{Protocol: lb.UDP, Addr: ap("10.96.0.13:53")}: 40056, // rejected by set membership, still its rule
	}
	if got := steered(r); !maps.Equal(got, want) {
		t.Errorf("SteeredUDP = %v, want %v", got, want)
	}

	for _, tc := range []struct {
		name    string
		change  func(p Ports, services []lb.Service) (Ports, []lb.Service)
		deletes []string
	}{
		{"unchanged", func(p Ports, s []lb.Service) (Ports, []lb.Service) { return p, s }, nil},
		{"a ClusterIP frontend moves", func(p Ports, s []lb.Service) (Ports, []lb.Service) {
			p.UDP[lb.Frontend{Protocol: lb.UDP, Addr: ap("10.96.0.53:53")}] = 40060
			return p, s
		}, []string{"10.96.0.53:53"}},
		{"an IPv6 NodePort moves", func(p Ports, s []lb.Service) (Ports, []lb.Service) {
			p.UDP[lb.Frontend{Protocol: lb.UDP, Addr: ap("[::]:30053")}] = 40061
			return p, s
		}, []string{"[2001:db8::10]:30053"}},
		{"a Service goes", func(p Ports, s []lb.Service) (Ports, []lb.Service) {
			return p, slices.DeleteFunc(s, func(s lb.Service) bool { return s.Name == svcName("dns") })
		}, []string{"10.96.0.53:53", "192.0.2.10:30053", "[2001:db8::10]:30053"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ct, flows := steeredFlows()
			r, f := newFakeRedirector(t, Config{IPv6: true, Conntrack: ct})
			mustApply(t, r, snap, testPorts(), true)
			deletedFlows(ct, flows)
			counted := r.ConntrackDeleted(netfilter.IPv4) + r.ConntrackDeleted(netfilter.IPv6)
			p, s := tc.change(testPorts(), testServices())
			mustApply(t, r, store(t, s...).Snapshot(), p, false)
			if got := deletedFlows(ct, flows); !slices.Equal(got, tc.deletes) {
				t.Errorf("conntrack entries deleted: to %q, want to %q", got, tc.deletes)
			}
			if n := r.ConntrackDeleted(netfilter.IPv4) + r.ConntrackDeleted(netfilter.IPv6) - counted; n != uint64(len(tc.deletes)) {
				t.Errorf("ConntrackDeleted counted %d, want %d", n, len(tc.deletes))
			}

			// A restart: the new process reads the ports back, and its
			// first Apply clears only what it moves.
			r2, err := New(Config{Backend: BackendIPTables, NFT: steertabletest.NewFake(), Mark: testMark, IPv6: true, Exec: f, Conntrack: ct})
			if err != nil {
				t.Fatal(err)
			}
			before := steered(r2)
			for fe, to := range p.UDP {
				if before[fe] != 0 && before[fe] != to {
					t.Errorf("after the restart %v is steered to %d, want %d", fe, before[fe], to)
				}
			}
			moved := maps.Clone(p.UDP)
			moved[lb.Frontend{Protocol: lb.UDP, Addr: ap("10.96.0.13:53")}] = 40099
			mustApply(t, r2, store(t, s...).Snapshot(), Ports{TCP: p.TCP, UDP: moved}, true)
			if got, want := deletedFlows(ct, flows), []string{"10.96.0.13:53"}; !slices.Equal(got, want) {
				t.Errorf("after the restart, conntrack entries deleted: to %q, want to %q", got, want)
			}
		})
	}
}

func TestParseSteered(t *testing.T) {
	for _, tc := range []struct {
		name string
		fam  netfilter.Family
		save string
		want map[lb.Frontend]uint16
	}{
		{"empty", netfilter.IPv4, "", map[lb.Frontend]uint16{}},
		{"both chains", netfilter.IPv4,
			"-N SVCPROXY-UDP\n-A SVCPROXY-UDP -d 10.96.0.53/32 -p udp -m udp --dport 53 -j REDIRECT --to-ports 40053\n" +
				"-A SVCPROXY-NP-UDP -p udp -m udp --dport 30053 -j REDIRECT --to-ports 40054\n",
			map[lb.Frontend]uint16{
				{Protocol: lb.UDP, Addr: ap("10.96.0.53:53")}: 40053,
				{Protocol: lb.UDP, Addr: ap("0.0.0.0:30053")}: 40054,
			}},
		{"IPv6", netfilter.IPv6,
			"-A SVCPROXY-UDP -d fd00::53/128 -p udp -m udp --dport 53 -j REDIRECT --to-ports 40058\n" +
				"-A SVCPROXY-NP-UDP -p udp -m udp --dport 30053 -j REDIRECT --to-ports 40055\n",
			map[lb.Frontend]uint16{
				{Protocol: lb.UDP, Addr: ap("[fd00::53]:53")}: 40058,
				{Protocol: lb.UDP, Addr: ap("[::]:30053")}:    40055,
			}},
		{"DNAT to a node address", netfilter.IPv4,
			"-A SVCPROXY-UDP -d 10.96.0.53/32 -p udp -m udp --dport 53 -j DNAT --to-destination 192.0.2.10:40053\n" +
				"-A SVCPROXY-NP-UDP -p udp -m udp --dport 30053 -j DNAT --to-destination 192.0.2.10:40054\n",
			map[lb.Frontend]uint16{
				{Protocol: lb.UDP, Addr: ap("10.96.0.53:53")}: 40053,
				{Protocol: lb.UDP, Addr: ap("0.0.0.0:30053")}: 40054,
			}},
		{"DNAT to a node address, IPv6", netfilter.IPv6,
			"-A SVCPROXY-UDP -d fd00::53/128 -p udp -m udp --dport 53 -j DNAT --to-destination [2001:db8::10]:40058\n",
			map[lb.Frontend]uint16{{Protocol: lb.UDP, Addr: ap("[fd00::53]:53")}: 40058}},
		{"skipped: other chains, other targets, a network, bad numbers, the wrong family", netfilter.IPv4,
			"-A SVCPROXY-SERVICES -p udp -m udp --dport 53 -j REDIRECT --to-ports 1\n" +
				"-A SVCPROXY-UDP -d 10.96.0.1/32 -p udp -m udp --dport 53 -j RETURN\n" +
				"-A SVCPROXY-UDP -d 10.96.0.0/24 -p udp -m udp --dport 53 -j REDIRECT --to-ports 2\n" +
				"-A SVCPROXY-UDP -d 10.96.0.2/32 -p udp -m udp --dport 70000 -j REDIRECT --to-ports 3\n" +
				"-A SVCPROXY-UDP -d 10.96.0.3/32 -p udp -m udp --dport 53 -j REDIRECT --to-ports x -j REDIRECT --to-ports 4\n" +
				"-A SVCPROXY-UDP -d fd00::1/128 -p udp -m udp --dport 53 -j REDIRECT --to-ports 5\n" +
				"-A SVCPROXY-UDP -p udp -m udp --dport 53 -j REDIRECT --to-ports 6\n" +
				"-A SVCPROXY-UDP -d 10.96.0.4/32 -p udp -m udp --dport 53 -j REDIRECT --to-ports 0\n" +
				"-A SVCPROXY-UDP -d 10.96.0.5/32 -p udp -m udp --dport 53 -j DNAT --to-destination 192.0.2.10\n" +
				"-A SVCPROXY-UDP -d 10.96.0.6/32 -p udp -m udp --dport 53 -j DNAT --to-destination 192.0.2.10:0\n" +
				"-A SVCPROXY-UDP -d 10.96.0.7/32 -p udp -m udp --dport 53 -j MASQUERADE --to-ports 8\n",
			map[lb.Frontend]uint16{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseSteered(tc.fam, []byte(tc.save)); !maps.Equal(got, tc.want) {
				t.Errorf("parseSteered = %v, want %v", got, tc.want)
			}
		})
	}
}

// FuzzParseSteered: whatever iptables-save prints, parsing never panics
// and yields only UDP frontends of the family with non-zero ports, and a
// ruleset svcproxy wrote reads back as the ports it was given.
func FuzzParseSteered(f *testing.F) {
	f.Add(uint16(53), uint16(40053), []byte{10, 96, 0, 53}, "-A SVCPROXY-UDP -d 10.0.0.1/32 -p udp -m udp --dport 1 -j REDIRECT --to-ports 2\n")
	f.Add(uint16(30053), uint16(1), []byte{}, "-A SVCPROXY-NP-UDP -p udp --dport 0 -j REDIRECT --to-ports 65536")
	f.Fuzz(func(t *testing.T, port, to uint16, addr []byte, noise string) {
		for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
			for fe, p := range parseSteered(fam, []byte(noise)) {
				if fe.Protocol != lb.UDP || fe.Addr.Port() == 0 || p == 0 || familyOf(fe.Addr.Addr()) != fam {
					t.Fatalf("parseSteered(%q) gave %v -> %d", noise, fe, p)
				}
			}
		}
		dst, ok := netip.AddrFromSlice(addr)
		if !ok || port == 0 || to == 0 {
			return
		}
		dst = dst.Unmap()
		fam := familyOf(dst)
		u := udpRedirect{dst: dst, port: port, to: to}
		if dst.IsUnspecified() {
			u.dst = netip.Addr{}
		}
		// Rules that REDIRECT, and rules that DNAT to a node address.
		var redirects, dnats Redirector
		dnats.to = [2]netip.Addr{nodeIP, nodeIP6}
		for _, r := range []*Redirector{&redirects, &dnats} {
			rules := r.chainRules(fam, 1, []udpRedirect{u}, nil)
			if !u.dst.IsValid() {
				rules = r.chainRules(fam, 1, nil, []udpRedirect{u})
			}
			var save string
			for _, c := range []string{chainUDP, chainNPUDP} {
				for _, rule := range rules[netfilter.Nat(c)] {
					save += "-A " + c + " " + rule + "\n"
				}
			}
			got := parseSteered(fam, []byte(noise+"\n"+save))
			if got[u.frontend(fam)] != to {
				t.Fatalf("rules %q read back as %v, want %v -> %d", save, got, u.frontend(fam), to)
			}
		}
	})
}

// TestBackendSwitchKeepsUDPPorts: a process steering with the other
// backend than the one before it reads the ports the old rules steer UDP
// frontends to (the forwarder binds them again, so steady flows that
// conntrack keeps sending there are still answered), and one it moves
// anyway loses its conntrack entries.
func TestBackendSwitchKeepsUDPPorts(t *testing.T) {
	ctx := context.Background()
	snap := store(t, testServices()...).Snapshot()
	dns := lb.Frontend{Protocol: lb.UDP, Addr: ap("10.96.0.53:53")}
	for _, tc := range []struct{ from, to Backend }{
		{BackendIPTables, BackendNFTables},
		{BackendNFTables, BackendIPTables},
	} {
		t.Run(string(tc.from)+" to "+string(tc.to), func(t *testing.T) {
			ct, flows := steeredFlows()
			f, k := netfiltertest.NewFake(), steertabletest.NewFake()
			mustApply(t, newRedirector(t, Config{Backend: tc.from, Exec: f, NFT: k, IPv6: true, Conntrack: ct}), snap, testPorts(), true)

			next := newRedirector(t, Config{Backend: tc.to, Exec: f, NFT: k, IPv6: true, Conntrack: ct})
			// Its own backend has nothing to read (the nftables table does
			// not exist yet: an error the userspace mode only logs).
			got, _ := next.SteeredUDP(ctx)
			for fe, to := range map[lb.Frontend]uint16{
				dns: 40053,
				{Protocol: lb.UDP, Addr: ap("0.0.0.0:30053")}: 40054,
				{Protocol: lb.UDP, Addr: ap("[::]:30053")}:    40055,
			} {
				if got[fe] != to {
					t.Errorf("SteeredUDP[%v] = %d, want %d (what the %s rules steer it to); got %v", fe, got[fe], to, tc.from, got)
				}
			}
			moved := testPorts()
			moved.UDP[dns] = 40099
			mustApply(t, next, snap, moved, true)
			if got, want := deletedFlows(ct, flows), []string{"10.96.0.53:53"}; !slices.Equal(got, want) {
				t.Errorf("conntrack entries deleted: to %q, want to %q", got, want)
			}
		})
	}
}
