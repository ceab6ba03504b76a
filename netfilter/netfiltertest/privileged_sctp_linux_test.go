//go:build linux

package netfiltertest

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/svcproxy/svcproxy/internal/sctp"
	"github.com/svcproxy/svcproxy/internal/topology"
	"github.com/svcproxy/svcproxy/lb"

	"github.com/svcproxy/svcproxy/netfilter"
)

// requireSCTPMatch skips t, saying why, when e's kernel cannot load an
// SCTP rule (no xt_sctp match).
func requireSCTPMatch(t *testing.T, e *netfilter.Exec) {
	t.Helper()
	probe := "*filter\n:SVCPROXY-PROBE - [0:0]\n-A SVCPROXY-PROBE -p sctp -m sctp --dport 1 -j RETURN\nCOMMIT\n" +
		"*filter\n-F SVCPROXY-PROBE\n-X SVCPROXY-PROBE\nCOMMIT\n"
	if err := e.IPTablesRestore(context.Background(), netfilter.IPv4, []byte(probe)); err != nil {
		t.Skipf("this kernel cannot match SCTP (CONFIG_NETFILTER_XT_MATCH_SCTP): %v", err)
	}
}

// TestPrivilegedSCTPMatches sends real SCTP INIT packets (a raw socket:
// the kernel needs no SCTP sockets for that) through one rule at a time
// and checks the kernel's rule counter agrees with the Fake's tracer on
// whether the rule matched: the -p sctp/-m sctp matches, an ipset member
// naming sctp, and bitmap:port, which never matches SCTP.
func TestPrivilegedSCTPMatches(t *testing.T) {
	privileged.Require(t)
	ctx := context.Background()
	topo := topology.NewT(t, topology.Options{Clients: 1, Backends: -1})
	client := topo.Clients[0]
	e := &netfilter.Exec{NetNS: client.NS}
	requireSCTPMatch(t, e)
	node := topology.NodeAddr.String()
	sets := "create svcproxy-t hash:ip,port family inet\nadd svcproxy-t " + node + ",sctp:3868\n" +
		"create svcproxy-u hash:ip,port family inet\nadd svcproxy-u " + node + ",tcp:3868\n" +
		"create svcproxy-p bitmap:port range 0-65535\nadd svcproxy-p 3868\n"
	fake := NewFake()
	for _, x := range []netfilter.Executor{e, fake} {
		if err := x.IPSetRestore(ctx, []byte(sets)); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := client.ListenPacket(ctx, "ip4:132", "0.0.0.0")
	if err != nil {
		t.Fatalf("raw SCTP socket: %v", err)
	}
	defer conn.Close()

	for _, tc := range []struct {
		match string
		want  bool
	}{
		{"-p sctp -m sctp --dport 3868", true},
		{"-p sctp -m sctp --dport 3869", false},
		{"-p tcp -m tcp --dport 3868", false},
		{"-d " + node + "/32 -p sctp", true},
		{"-m set --match-set svcproxy-t dst,dst", true},
		{"-m set --match-set svcproxy-u dst,dst", false},
		{"-p sctp -m set --match-set svcproxy-p dst", false},
	} {
		t.Run(tc.match, func(t *testing.T) {
			rules := "*filter\n-F OUTPUT\n-A OUTPUT " + tc.match + " -j DROP\nCOMMIT\n"
			for _, x := range []netfilter.Executor{e, fake} {
				if err := x.IPTablesRestore(ctx, netfilter.IPv4, []byte(rules)); err != nil {
					t.Fatal(err)
				}
			}
			// A DROP in OUTPUT fails the send with EPERM: the counter says.
			conn.WriteTo(sctp.Init(40000, 3868, 1), &net.IPAddr{IP: net.ParseIP(node)})
			out, err := client.Command(ctx, "iptables-save", "-c", "-t", "filter").Output()
			if err != nil {
				t.Fatalf("iptables-save -c: %v", err)
			}
			kernel := outputCount(t, string(out)) > 0
			v := fake.Trace(Packet{Src: netip.AddrPortFrom(client.Addr, 40000), Dst: netip.AddrPortFrom(topology.NodeAddr, 3868),
				Proto: lb.SCTP, Hook: Output, LocalAddrs: []netip.Addr{client.Addr}})
			if kernel != tc.want || (v.Action == Drop) != tc.want {
				t.Errorf("rule matched: kernel %v, Fake %v (%v); want %v", kernel, v.Action == Drop, v, tc.want)
			}
		})
	}
}

// outputCount is the packet counter of the one rule in filter OUTPUT, from
// iptables-save -c output.
func outputCount(t *testing.T, save string) int {
	t.Helper()
	for line := range strings.Lines(save) {
		// [packets:bytes] -A OUTPUT ...
		if c, rest, ok := strings.Cut(strings.TrimSpace(line), " "); ok && strings.HasPrefix(rest, "-A OUTPUT ") {
			pk, _, _ := strings.Cut(strings.Trim(c, "[]"), ":")
			n, err := strconv.Atoi(pk)
			if err != nil {
				t.Fatalf("counter in %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("no rule in filter OUTPUT:\n%s", save)
	return 0
}
