package netfiltertest

import (
	"context"
	"testing"

	"github.com/svcproxy/svcproxy/lb"

	"github.com/svcproxy/svcproxy/netfilter"
)

// kernelCase is one input to the kernel tools, with whether they accept it.
// The same table runs against the Fake here and against the real tools in
// TestPrivilegedFakeParity, so the Fake refuses what the kernel refuses.
type kernelCase struct {
	name   string
	ipset  string           // ipset restore input (or else rules)
	family netfilter.Family // for rules
	rules  string           // iptables-restore input
	ok     bool             // whether the tools accept the input
	// ipsetFirst is ipset restore input applied (and required to succeed)
	// before rules.
	ipsetFirst string
}

// base is applied before every case: a set and a chain to refer to.
const (
	baseSets  = "create svcproxy-t hash:ip,port family inet\ncreate svcproxy-t6 hash:ip,port family inet6\ncreate svcproxy-p bitmap:port range 0-65535\ncreate svcproxy-h hash:ip,port,ip family inet\n"
	baseRules = "*nat\n:SVCPROXY-T - [0:0]\n-A SVCPROXY-T -m set --match-set svcproxy-t dst,dst -j RETURN\nCOMMIT\n"
)

var kernelCases = []kernelCase{
	{name: "redirect rule", rules: "*nat\n-A SVCPROXY-T -p tcp -m set --match-set svcproxy-t dst,dst -j REDIRECT --to-ports 15001\nCOMMIT\n", ok: true},
	{name: "jump to a missing chain", rules: "*nat\n-A PREROUTING -j SVCPROXY-NOPE\nCOMMIT\n"},
	{name: "missing set", rules: "*nat\n-A SVCPROXY-T -m set --match-set svcproxy-nope dst -j RETURN\nCOMMIT\n"},
	{name: "REDIRECT in filter", rules: "*filter\n-A INPUT -p tcp -j REDIRECT --to-ports 1\nCOMMIT\n"},
	{name: "REJECT in nat", rules: "*nat\n-A PREROUTING -p tcp -j REJECT\nCOMMIT\n"},
	{name: "tcp-reset without -p tcp", rules: "*filter\n-A INPUT -j REJECT --reject-with tcp-reset\nCOMMIT\n"},
	{name: "tcp-reset with -p tcp", rules: "*filter\n-A INPUT -p tcp -j REJECT --reject-with tcp-reset\nCOMMIT\n", ok: true},
	{name: "delete a referenced chain", rules: "*nat\n-A PREROUTING -j SVCPROXY-T\nCOMMIT\n*nat\n:SVCPROXY-T - [0:0]\n-X SVCPROXY-T\nCOMMIT\n"},
	{name: "delete a chain after its jump", rules: "*nat\n-A PREROUTING -j SVCPROXY-T\nCOMMIT\n*nat\n:SVCPROXY-T - [0:0]\n-D PREROUTING -j SVCPROXY-T\n-X SVCPROXY-T\nCOMMIT\n", ok: true},
	{name: "delete a non-empty chain", rules: "*nat\n-X SVCPROXY-T\nCOMMIT\n"},
	{name: "delete a missing rule", rules: "*nat\n-D PREROUTING -j SVCPROXY-T\nCOMMIT\n"},
	{name: "insert at 1", rules: "*nat\n-I PREROUTING 1 -j SVCPROXY-T\nCOMMIT\n", ok: true},
	{name: "IPv4 address in ip6tables", family: netfilter.IPv6, rules: "*nat\n:SVCPROXY-T - [0:0]\n-A SVCPROXY-T -d 10.0.0.1/32 -j RETURN\nCOMMIT\n"},
	{name: "IPv6 set in ip6tables", family: netfilter.IPv6, rules: "*nat\n:SVCPROXY-T - [0:0]\n-A SVCPROXY-T -d fd00::1/128 -p udp -m udp --dport 53 -m set --match-set svcproxy-t6 dst,dst -j REDIRECT --to-ports 1\nCOMMIT\n", ok: true},
	{name: "ipset add", ipset: "add svcproxy-t 10.0.0.1,tcp:80\nadd svcproxy-t 10.0.0.1,udp:80\nadd svcproxy-p 30000\n", ok: true},
	{name: "ipset add twice (-exist)", ipset: "add svcproxy-t 10.0.0.1,tcp:80\nadd svcproxy-t 10.0.0.1,tcp:80\n", ok: true},
	{name: "ipset del missing (-exist)", ipset: "add svcproxy-t 10.0.0.1,tcp:80\ndel svcproxy-t 10.0.0.2,tcp:80\ndel svcproxy-t 10.0.0.2,tcp:80\n", ok: true},
	{name: "ipset add to a missing set", ipset: "add svcproxy-nope 10.0.0.1,tcp:80\n"},
	{name: "ipset wrong family", ipset: "add svcproxy-t fd00::1,tcp:80\n"},
	{name: "ipset create existing (-exist)", ipset: "create svcproxy-t hash:ip,port family inet\n", ok: true},
	{name: "ipset create existing, other maxelem", ipset: "create svcproxy-t hash:ip,port family inet maxelem 5\n"},
	{name: "ipset create existing, other type", ipset: "create svcproxy-t hash:net family inet\n"},
	{name: "ipset swap", ipset: "create svcproxy-u hash:ip,port family inet maxelem 1048576\nadd svcproxy-u 10.0.0.2,tcp:1\nswap svcproxy-u svcproxy-t\ndestroy svcproxy-u\n", ok: true},
	{name: "ipset swap incompatible", ipset: "swap svcproxy-t svcproxy-t6\n"},
	{name: "ipset destroy in use", ipset: "destroy svcproxy-t\n"},
	{name: "ipset destroy missing (-exist)", ipset: "destroy svcproxy-nope\n", ok: true},
	{name: "hash:net /0", ipset: "create svcproxy-n hash:net family inet\nadd svcproxy-n 0.0.0.0/0\n"},
	{name: "bitmap out of range", ipset: "create svcproxy-q bitmap:port range 30000-32767\nadd svcproxy-q 80\n"},
	{name: "REDIRECT to a port without -p", rules: "*nat\n-A SVCPROXY-T -j REDIRECT --to-ports 1\nCOMMIT\n"},

	// What the DNAT mode writes.
	{name: "DNAT rules", rules: "*nat\n:SVCPROXY-D - [0:0]\n" +
		"-A SVCPROXY-D -p tcp -m statistic --mode random --probability 0.33333333349 -j DNAT --to-destination 10.244.0.1:8080\n" +
		"-A SVCPROXY-D -m recent --rcheck --seconds 10800 --reap --name SVCPROXY-D --mask 255.255.255.255 --rsource -j RETURN\n" +
		"-A SVCPROXY-D -p udp -m recent --set --name SVCPROXY-D --mask 255.255.255.255 --rsource -j DNAT --to-destination 10.244.0.2:53\n" +
		"-A SVCPROXY-D ! -s 10.244.0.0/16 -j MARK --set-xmark 0x4000/0x4000\n" +
		"-A PREROUTING -j SVCPROXY-D\n-A OUTPUT -j SVCPROXY-D\nCOMMIT\n", ok: true},
	{name: "masquerade rules", rules: "*nat\n:SVCPROXY-M - [0:0]\n" +
		"-A SVCPROXY-M -m conntrack --ctstate DNAT -m set --match-set svcproxy-h dst,dst,src -j MASQUERADE --random-fully\n" +
		"-A SVCPROXY-M -m mark ! --mark 0x4000/0x4000 -j RETURN\n-A SVCPROXY-M -j MARK --set-xmark 0x4000/0x0\n-A SVCPROXY-M -j MASQUERADE\n" +
		"-A POSTROUTING -j SVCPROXY-M\nCOMMIT\n", ok: true},
	{name: "IPv6 DNAT", family: netfilter.IPv6, rules: "*nat\n:SVCPROXY-D - [0:0]\n-A SVCPROXY-D -p tcp -j DNAT --to-destination [fd00::1]:8080\nCOMMIT\n", ok: true},
	{name: "SCTP DNAT", rules: "*nat\n:SVCPROXY-D - [0:0]\n:SVCPROXY-D2 - [0:0]\n-A SVCPROXY-D -d 10.96.0.3/32 -p sctp -m sctp --dport 3868 -j SVCPROXY-D2\n" +
		"-A SVCPROXY-D2 -p sctp -m statistic --mode random --probability 0.5 -j DNAT --to-destination 10.244.0.3:3868\n" +
		"-A SVCPROXY-D2 -p sctp -j DNAT --to-destination 10.244.0.4:3868\nCOMMIT\n", ok: true},
	{name: "SCTP REJECT", rules: "*filter\n-A INPUT -p sctp -m sctp --dport 3868 -j REJECT --reject-with icmp-port-unreachable\nCOMMIT\n", ok: true},
	{name: "tcp-reset with -p sctp", rules: "*filter\n-A INPUT -p sctp -j REJECT --reject-with tcp-reset\nCOMMIT\n"},
	{name: "DNAT in POSTROUTING", rules: "*nat\n-A POSTROUTING -p tcp -j DNAT --to-destination 10.0.0.1:80\nCOMMIT\n"},
	{name: "DNAT reached from POSTROUTING", rules: "*nat\n:SVCPROXY-Y - [0:0]\n-A SVCPROXY-Y -p tcp -j DNAT --to-destination 10.0.0.1:80\n-A POSTROUTING -j SVCPROXY-Y\nCOMMIT\n"},
	{name: "MASQUERADE in PREROUTING", rules: "*nat\n-A PREROUTING -j MASQUERADE\nCOMMIT\n"},
	{name: "MASQUERADE reached from PREROUTING", rules: "*nat\n:SVCPROXY-Z - [0:0]\n-A SVCPROXY-Z -j MASQUERADE\n-A PREROUTING -j SVCPROXY-Z\nCOMMIT\n"},
	{name: "MASQUERADE in filter", rules: "*filter\n:SVCPROXY-X - [0:0]\n-A SVCPROXY-X -j MASQUERADE\nCOMMIT\n"},
	{name: "DNAT in filter", rules: "*filter\n:SVCPROXY-X - [0:0]\n-A SVCPROXY-X -p tcp -j DNAT --to-destination 10.0.0.1:80\nCOMMIT\n"},
	{name: "DNAT to a port without -p", rules: "*nat\n:SVCPROXY-X - [0:0]\n-A SVCPROXY-X -j DNAT --to-destination 10.0.0.1:80\nCOMMIT\n"},
	{name: "DNAT to an address without -p", rules: "*nat\n:SVCPROXY-X - [0:0]\n-A SVCPROXY-X -j DNAT --to-destination 10.0.0.1\nCOMMIT\n", ok: true},
	{name: "DNAT to IPv6 in iptables", rules: "*nat\n:SVCPROXY-X - [0:0]\n-A SVCPROXY-X -p tcp -j DNAT --to-destination [fd00::1]:80\nCOMMIT\n"},
	{name: "--reap without --seconds", rules: "*nat\n:SVCPROXY-X - [0:0]\n-A SVCPROXY-X -m recent --rcheck --reap --name A -j RETURN\nCOMMIT\n"},
	{name: "--set with --rcheck", rules: "*nat\n:SVCPROXY-X - [0:0]\n-A SVCPROXY-X -m recent --set --rcheck --name A -j RETURN\nCOMMIT\n"},
	{name: "probability above 1", rules: "*nat\n:SVCPROXY-X - [0:0]\n-A SVCPROXY-X -m statistic --mode random --probability 1.5 -j RETURN\nCOMMIT\n"},
	{name: "bad ctstate", rules: "*nat\n:SVCPROXY-X - [0:0]\n-A SVCPROXY-X -m conntrack --ctstate BOGUS -j RETURN\nCOMMIT\n"},
	{name: "MARK in filter", rules: "*filter\n:SVCPROXY-X - [0:0]\n-A SVCPROXY-X -j MARK --set-xmark 0x1/0x1\nCOMMIT\n", ok: true},
	{name: "MARK without an operation", rules: "*nat\n:SVCPROXY-X - [0:0]\n-A SVCPROXY-X -j MARK\nCOMMIT\n"},
	{name: "hash:ip,port,ip members", ipset: "add svcproxy-h 10.244.0.1,tcp:8080,10.244.0.1\nadd svcproxy-h 10.244.0.2,udp:53,10.244.0.2\n", ok: true},
	{name: "hash:ip,port,ip with protocol numbers", ipset: "add svcproxy-h 10.244.0.1,6:8080,10.244.0.1\nadd svcproxy-h 10.244.0.2,17:53,10.244.0.2\n", ok: true},
	{name: "hash:ip,port,ip with sctp", ipset: "add svcproxy-h 10.244.0.3,sctp:3868,10.244.0.3\nadd svcproxy-h 10.244.0.4,132:3868,10.244.0.4\nadd svcproxy-t 10.96.0.3,sctp:3868\n", ok: true},
	{name: "hash:ip,port,ip without the third element", ipset: "add svcproxy-h 10.244.0.1,tcp:8080\n"},
	{name: "hash:ip,port,ip with a net", ipset: "add svcproxy-h 10.244.0.1,tcp:8080,10.244.0.0/24\n"},

	// What the IPVS mode writes: hash:ip sets of VIPs and node IPs.
	{name: "hash:ip members", ipset: "create svcproxy-i hash:ip family inet hashsize 1024 maxelem 65536\nadd svcproxy-i 10.96.0.1\nadd svcproxy-i 10.96.1.0/30\n" +
		"create svcproxy-i6 hash:ip family inet6\nadd svcproxy-i6 fd00::1\n", ok: true},
	{name: "hash:ip default family", ipset: "create svcproxy-i hash:ip\nadd svcproxy-i 2001:db8::1\n"},
	{name: "hash:ip IPv6 prefix", ipset: "create svcproxy-i6 hash:ip family inet6\nadd svcproxy-i6 fd00::/126\n"},
	{name: "hash:ip more than maxelem", ipset: "create svcproxy-i hash:ip family inet\nadd svcproxy-i 10.0.0.0/8\n"},
	{name: "hash:ip rule", rules: "*filter\n:SVCPROXY-X - [0:0]\n-A SVCPROXY-X -p tcp -m conntrack --ctstate NEW -m set --match-set svcproxy-i dst -m set ! --match-set svcproxy-t dst,dst -j REJECT --reject-with tcp-reset\nCOMMIT\n",
		ipsetFirst: "create svcproxy-i hash:ip family inet\n", ok: true},
}

// runKernelCase applies the base and the case to e and reports whether the
// case's input was accepted.
func runKernelCase(t *testing.T, e netfilter.Executor, tc kernelCase) bool {
	t.Helper()
	ctx := context.Background()
	if err := e.IPSetRestore(ctx, []byte(baseSets)); err != nil {
		t.Fatalf("base sets: %v", err)
	}
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		base := baseRules
		if fam == netfilter.IPv6 {
			base = "*nat\n:SVCPROXY-T - [0:0]\n-A SVCPROXY-T -m set --match-set svcproxy-t6 dst,dst -j RETURN\nCOMMIT\n"
		}
		if err := e.IPTablesRestore(ctx, fam, []byte(base)); err != nil {
			t.Fatalf("base %v rules: %v", fam, err)
		}
	}
	if tc.ipsetFirst != "" {
		if err := e.IPSetRestore(ctx, []byte(tc.ipsetFirst)); err != nil {
			t.Fatalf("sets before the case: %v", err)
		}
	}
	var err error
	if tc.ipset != "" {
		err = e.IPSetRestore(ctx, []byte(tc.ipset))
	} else {
		err = e.IPTablesRestore(ctx, tc.family, []byte(tc.rules))
	}
	t.Logf("error: %v", err)
	return err == nil
}

func TestFakeRefusesWhatTheKernelRefuses(t *testing.T) {
	for _, tc := range kernelCases {
		t.Run(tc.name, func(t *testing.T) {
			if got := runKernelCase(t, NewFake(), tc); got != tc.ok {
				t.Errorf("accepted = %v, want %v", got, tc.ok)
			}
		})
	}
}

// TestTraceForeignRules checks the tracer's handling of rules it does not
// understand and of foreign verdicts.
func TestTraceForeignRules(t *testing.T) {
	f := NewFake()
	ctx := context.Background()
	if err := f.IPTablesRestore(ctx, netfilter.IPv4, []byte("*filter\n-A FORWARD -i eth0 -j DROP\n-A OUTPUT -d 192.0.2.1/32 -j DROP\n-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	checkTrace(t, f, pkt(lb.TCP, "10.0.0.1:80", Prerouting), accepted) // -i is not modelled: never matches
	checkTrace(t, f, pkt(lb.TCP, "192.0.2.1:80", Output), Verdict{Action: Drop})
	checkTrace(t, f, pkt(lb.TCP, "192.0.2.10:22", Prerouting), accepted)
}

func TestRestoreFailures(t *testing.T) {
	ctx := context.Background()
	f := NewFake()
	var c netfilter.RestoreFailures
	good := []byte("*nat\n:SVCPROXY-X - [0:0]\nCOMMIT\n")
	if err := c.Restore(ctx, f, netfilter.IPv4, good); err != nil {
		t.Fatal(err)
	}
	if err := c.Restore(ctx, f, netfilter.IPv6, []byte("*nat\n-A PREROUTING -j NOPE\nCOMMIT\n")); err == nil {
		t.Fatal("a restore the Fake refuses succeeded")
	}
	f.FailNext("iptables-restore", context.DeadlineExceeded)
	if err := c.Restore(ctx, f, netfilter.IPv4, good); err == nil {
		t.Fatal("FailNext did not fail the restore")
	}
	if v4, v6 := c.Count(netfilter.IPv4), c.Count(netfilter.IPv6); v4 != 1 || v6 != 1 {
		t.Errorf("failures IPv4 %d, IPv6 %d; want 1 each", v4, v6)
	}
}
