package netfilter_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
)

// TestCleanup: a mode's chains, the jumps into them and its sets go; what
// shares the tables (another prefix, foreign rules, foreign sets) stays.
func TestCleanup(t *testing.T) {
	ctx := context.Background()
	f := netfiltertest.NewFake()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(f.IPSetRestore(ctx, []byte("create svcproxy-dnat-a hash:ip,port family inet\ncreate svcproxy-other hash:net family inet\ncreate foreign hash:net family inet\n")))
	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		must(f.IPTablesRestore(ctx, fam, []byte("*nat\n"+
			":SVCPROXY-DNAT-SERVICES - [0:0]\n:SVCPROXY-DNAT-SVC-X - [0:0]\n:SVCPROXY-OTHER - [0:0]\n:FOREIGN - [0:0]\n"+
			"-A SVCPROXY-DNAT-SERVICES -p tcp -m tcp --dport 80 -j SVCPROXY-DNAT-SVC-X\n"+
			"-A PREROUTING -j SVCPROXY-DNAT-SERVICES\n-A OUTPUT -m addrtype --dst-type LOCAL -j SVCPROXY-DNAT-SERVICES\n"+
			"-A PREROUTING -j SVCPROXY-OTHER\n-A PREROUTING -j FOREIGN\n-A FOREIGN -p tcp -j RETURN\nCOMMIT\n"+
			"*filter\n:SVCPROXY-DNAT-FILTER - [0:0]\n-A INPUT -j SVCPROXY-DNAT-FILTER\n-A INPUT -p tcp -j ACCEPT\nCOMMIT\n")))
	}
	must(f.IPTablesRestore(ctx, netfilter.IPv4, []byte("*filter\n-A SVCPROXY-DNAT-FILTER -m set --match-set svcproxy-dnat-a dst,dst -j ACCEPT\nCOMMIT\n")))

	must(netfilter.Cleanup(ctx, f, "SVCPROXY-DNAT-", "svcproxy-dnat-", true))

	for _, fam := range []netfilter.Family{netfilter.IPv4, netfilter.IPv6} {
		for _, tbl := range []string{"nat", "filter"} {
			out, err := f.IPTablesSave(ctx, fam, tbl)
			must(err)
			if strings.Contains(string(out), "SVCPROXY-DNAT-") {
				t.Errorf("%v %s still holds SVCPROXY-DNAT-:\n%s", fam, tbl, out)
			}
			for _, keep := range map[string][]string{
				"nat":    {"-A PREROUTING -j SVCPROXY-OTHER", "-A PREROUTING -j FOREIGN", "-A FOREIGN -p tcp -j RETURN"},
				"filter": {"-A INPUT -p tcp -j ACCEPT"},
			}[tbl] {
				if !strings.Contains(string(out), keep) {
					t.Errorf("%v %s lost %q:\n%s", fam, tbl, keep, out)
				}
			}
		}
	}
	names, err := f.IPSetNames(ctx)
	must(err)
	slices.Sort(names)
	if want := []string{"foreign", "svcproxy-other"}; !slices.Equal(names, want) {
		t.Errorf("sets after Cleanup: %v, want %v", names, want)
	}
	// Nothing left: a second Cleanup has nothing to do and writes nothing.
	f.ResetCalls()
	must(netfilter.Cleanup(ctx, f, "SVCPROXY-DNAT-", "svcproxy-dnat-", true))
	if n := f.CountCalls("iptables-restore"); n != 0 {
		t.Errorf("a second Cleanup ran iptables-restore %d times, want 0", n)
	}
}
