//go:build linux

package netfilter

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/svcproxy/svcproxy/internal/kerneltest"
)

// Privileged is the gate for the privileged tests of package
// netfilter_test, which cannot see privileged.
var Privileged = &privileged

// privileged gates the privileged tests: root and the tools.
var privileged = kerneltest.Gate{
	Package: "./netfilter/",
	Prefix:  "svcproxy-nftest-",
	Tools:   []string{"ip", "iptables-restore", "iptables-save", "ip6tables-restore", "ip6tables-save", "ipset"},
}

// TestPrivilegedCanonical writes each canonical case with the real tools and
// checks iptables-save prints exactly the canonical form: the form a
// full sync compares with to tell tampering from its own rules.
func TestPrivilegedCanonical(t *testing.T) {
	privileged.Require(t)
	ctx := context.Background()
	for _, v := range kerneltest.Variants() {
		t.Run(kerneltest.VariantName(v), func(t *testing.T) {
			e := &Exec{NetNS: privileged.NewNS(t), Variant: v}
			if err := e.IPSetRestore(ctx, []byte(canonicalSets)); err != nil {
				t.Fatal(err)
			}
			for _, tc := range canonicalCases {
				want, err := Canonical(tc.family, tc.spec)
				if err != nil {
					t.Errorf("Canonical(%q): %v", tc.spec, err)
					continue
				}
				in := fmt.Sprintf("*%s\n:SVCPROXY-C - [0:0]\n-A SVCPROXY-C %s\nCOMMIT\n", tc.table, tc.spec)
				if err := e.IPTablesRestore(ctx, tc.family, []byte(in)); err != nil {
					t.Errorf("%v %s: %v", tc.family, tc.spec, err)
					continue
				}
				out, err := e.IPTablesSave(ctx, tc.family, tc.table)
				if err != nil {
					t.Fatal(err)
				}
				got := ""
				for line := range strings.Lines(string(out)) {
					if s, ok := strings.CutPrefix(strings.TrimSpace(line), "-A SVCPROXY-C "); ok {
						got = s
					}
				}
				if got != want {
					t.Errorf("%v %s\n iptables-save: %s\n canonical:     %s", tc.family, tc.spec, got, want)
				}
				// The saved form, read back, is its own canonical form.
				if again, err := Canonical(tc.family, got); err != nil || again != got {
					t.Errorf("Canonical(saved %q) = %q, %v", got, again, err)
				}
			}
		})
	}
}

// canonicalSets are the sets canonicalCases name.
const canonicalSets = "create svcproxy-t hash:ip,port family inet\ncreate svcproxy-t6 hash:ip,port family inet6\ncreate svcproxy-p bitmap:port range 0-65535\ncreate svcproxy-h hash:ip,port,ip family inet\n"

// canonicalCases are rules as svcproxy writes them; the canonical
// form of each must be what iptables-save prints (TestPrivilegedCanonical).
var canonicalCases = []struct {
	family Family
	table  string
	spec   string
}{
	{IPv4, "nat", "-d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j RETURN"},
	{IPv4, "nat", "! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j RETURN"},
	{IPv4, "nat", "-p tcp -m statistic --mode random --probability 0.3333333333 -j DNAT --to-destination 10.244.0.1:8080"},
	{IPv4, "nat", "-p udp -m statistic --mode random --probability 0.1 -j DNAT --to-destination 10.244.0.1:53"},
	{IPv4, "nat", "-p tcp -j DNAT --to-destination 10.244.0.3:8080"},
	{IPv4, "nat", "-m recent --rcheck --seconds 10800 --reap --name SVCPROXY-X --rsource -j RETURN"},
	{IPv4, "nat", "-p tcp -m recent --set --name SVCPROXY-X -j DNAT --to-destination 10.244.0.1:8080"},
	{IPv4, "nat", "! -s 10.244.0.0/16 -j MARK --or-mark 0x4000"},
	{IPv4, "nat", "-j MARK --xor-mark 0x4000"},
	{IPv4, "nat", "-j MARK --set-xmark 0x4000/0x4000"},
	{IPv4, "nat", "-m mark ! --mark 0x4000/0x4000 -j RETURN"},
	{IPv4, "nat", "-m conntrack --ctstate DNAT -m set --match-set svcproxy-h dst,dst,src -j MASQUERADE --random-fully"},
	{IPv4, "nat", "-j MASQUERADE"},
	{IPv4, "filter", "-d 10.96.0.12/32 -p tcp -m tcp --dport 80 -j REJECT --reject-with tcp-reset"},
	{IPv4, "filter", "-p udp -m udp --dport 30053 -j REJECT --reject-with icmp-port-unreachable"},
	{IPv4, "filter", "-m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT"},
	{IPv4, "nat", "-d 10.96.0.3/32 -p sctp -m sctp --dport 3868 -j RETURN"},
	{IPv4, "nat", "-p sctp -m statistic --mode random --probability 0.5 -j DNAT --to-destination 10.244.0.3:3868"},
	{IPv4, "nat", "-p sctp -m recent --set --name SVCPROXY-X -j DNAT --to-destination 10.244.0.3:3868"},
	{IPv4, "filter", "-p sctp -m sctp --dport 30868 -j REJECT --reject-with icmp-port-unreachable"},
	{IPv6, "nat", "-d fd00::3/128 -p sctp -m sctp --dport 3868 -j RETURN"},
	{IPv4, "filter", "-m mark --mark 0x4000/0x4000 -j ACCEPT"},
	{IPv6, "nat", "-p tcp -m statistic --mode random --probability 0.25 -j DNAT --to-destination [fd00::1]:8080"},
	{IPv6, "nat", "-m recent --rcheck --seconds 5 --reap --name SVCPROXY-X6 --rsource -j RETURN"},
	{IPv6, "nat", "! -d ::1/128 -m addrtype --dst-type LOCAL -j RETURN"},
	{IPv6, "filter", "-d fd00::10/128 -p udp -m udp --dport 53 -j REJECT --reject-with icmp6-port-unreachable"},
}
