//go:build linux

package netfiltertest

import (
	"context"
	"testing"

	"github.com/svcproxy/svcproxy/internal/kerneltest"

	"github.com/svcproxy/svcproxy/netfilter"
)

// privileged gates the privileged tests: root and the tools.
var privileged = kerneltest.Gate{
	Package: "./netfilter/netfiltertest/",
	Prefix:  "svcproxy-nfttest-",
	Tools:   []string{"ip", "iptables-restore", "iptables-save", "ip6tables-restore", "ip6tables-save", "ipset"},
}

// TestPrivilegedFakeParity runs the Fake's refusal table against the real
// tools: the Fake must accept and refuse exactly what they do.
func TestPrivilegedFakeParity(t *testing.T) {
	privileged.Require(t)
	for _, v := range kerneltest.Variants() {
		t.Run(kerneltest.VariantName(v), func(t *testing.T) {
			for _, tc := range kernelCases {
				t.Run(tc.name, func(t *testing.T) {
					if got := runKernelCase(t, &netfilter.Exec{NetNS: privileged.NewNS(t), Variant: v}, tc); got != tc.ok {
						t.Errorf("the real tools: accepted = %v; the Fake's table says %v", got, tc.ok)
					}
				})
			}
		})
	}
}

// TestPrivilegedSaveChains loads the same rules into the real tools and the
// Fake and reads a few chains back from each: both print the same, a
// missing chain is left out, and what ReadOwned finds in them is what it
// finds in the whole table.
func TestPrivilegedSaveChains(t *testing.T) {
	privileged.Require(t)
	ctx := context.Background()
	const rules = "*nat\n:SVCPROXY-A - [0:0]\n:SVCPROXY-B - [0:0]\n:OTHER - [0:0]\n" +
		"-A PREROUTING -j SVCPROXY-A\n-A OUTPUT -s 10.0.0.0/8 -j SVCPROXY-A\n-A OTHER -j RETURN\n" +
		"-A SVCPROXY-A -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j SVCPROXY-B\n" +
		"-A SVCPROXY-B -p tcp -j DNAT --to-destination 10.1.0.1:8080\nCOMMIT\n"
	chains := []string{"PREROUTING", "OUTPUT", "SVCPROXY-A", "SVCPROXY-MISSING"}
	fake := NewFake()
	if err := fake.IPTablesRestore(ctx, netfilter.IPv4, []byte(rules)); err != nil {
		t.Fatal(err)
	}
	want, err := fake.IPTablesSaveChains(ctx, netfilter.IPv4, "nat", chains)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range kerneltest.Variants() {
		t.Run(kerneltest.VariantName(v), func(t *testing.T) {
			e := &netfilter.Exec{NetNS: privileged.NewNS(t), Variant: v}
			if err := e.IPTablesRestore(ctx, netfilter.IPv4, []byte(rules)); err != nil {
				t.Fatal(err)
			}
			got, err := e.IPTablesSaveChains(ctx, netfilter.IPv4, "nat", chains)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("real:\n%s\nFake:\n%s", got, want)
			}
			part, err := netfilter.ReadOwned(netfilter.IPv4, "nat", got, "SVCPROXY-")
			if err != nil {
				t.Fatal(err)
			}
			if len(part.Jumps) != 2 || len(part.Chains) != 1 || len(part.Chains["SVCPROXY-A"]) != 1 {
				t.Errorf("ReadOwned of the chains: %+v", part)
			}
		})
	}
}
