//go:build linux

package redirect

import (
	"context"
	"maps"
	"os"
	"slices"
	"testing"

	nft "github.com/google/nftables"
	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/nftable"
	"github.com/svcproxy/svcproxy/redirect/steertable"
)

// tablesIn lists the nftables tables of namespace ns as "family name".
func tablesIn(t *testing.T, ns string) []string {
	t.Helper()
	f, err := os.Open("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := nft.New(nft.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	ts, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, tb := range ts {
		fam := "ip"
		if tb.Family == nft.TableFamilyIPv6 {
			fam = "ip6"
		} else if tb.Family != nft.TableFamilyIPv4 {
			fam = "other"
		}
		out = append(out, fam+" "+tb.Name)
	}
	slices.Sort(out)
	return out
}

// TestPrivilegedNFTApplyCleanup runs the nftables backend against the real
// kernel: what a full sync reads back is what it wrote, tampering is
// repaired and counted, another program's table is left alone, and Cleanup
// removes both tables.
func TestPrivilegedNFTApplyCleanup(t *testing.T) {
	privileged.Require(t)
	ctx := context.Background()
	ns := privileged.NewNS(t)
	foreign := nftable.Table{Name: "foreign", Family: netfilter.IPv4, Chains: []*nft.Chain{{Name: "mine"}}}
	if _, err := nftable.NewConn(ns).Setup(ctx, foreign, true); err != nil {
		t.Fatalf("writing a foreign table: %v", err)
	}
	before := tablesIn(t, ns)

	r, err := New(Config{Backend: BackendNFTables, NetNS: ns, Mark: testMark, IPv6: true,
		Exec: netfilter.NewExec(ns), Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	st := store(t, testServices()...)
	mustApply(t, r, st.Snapshot(), testPorts(), true)
	if got, want := tablesIn(t, ns), slices.Sorted(slices.Values(append(slices.Clone(before), "ip "+Table, "ip6 "+Table))); !slices.Equal(got, want) {
		t.Errorf("tables %v, want %v", got, want)
	}
	mustApply(t, r, st.Snapshot(), testPorts(), true)
	if r.Repairs() != 0 {
		t.Fatalf("Repairs = %d after an untouched full sync: what was written and what reads back disagree", r.Repairs())
	}
	svcs := testServices()
	svcs[3].Endpoints = eps(1, "")
	snap, _ := st.Update([]lb.Service{svcs[3]}, []lb.ServicePortName{svcName("web")})
	mustApply(t, r, snap, testPorts(), false)
	mustApply(t, r, snap, testPorts(), true)
	if r.Repairs() != 0 {
		t.Fatalf("Repairs = %d after incremental syncs", r.Repairs())
	}

	// Tamper with the real thing, through a socket of our own.
	k := steertable.Netlink(ns)
	read := func(fam netfilter.Family) map[string]map[string]string {
		out := map[string]map[string]string{}
		for _, set := range steertable.Sets {
			es, err := k.Elements(ctx, fam, set)
			if err != nil {
				t.Fatalf("reading %v %s: %v", fam, set, err)
			}
			out[set] = es
		}
		return out
	}
	want4, want6 := read(netfilter.IPv4), read(netfilter.IPv6)
	if len(want6[steertable.SetNodePorts]) == 0 {
		t.Fatalf("the ip6 table holds no NodePorts to restore: %v", want6)
	}
	var victim nftable.Element
	for key, val := range want4[steertable.SetFrontends] {
		victim = nftable.Element{Set: steertable.SetFrontends, Key: key, Val: val}
		break
	}
	if err := k.Update(ctx, netfilter.IPv4, []nftable.Element{victim}, nil); err != nil {
		t.Fatalf("deleting an element: %v", err)
	}
	if err := k.Delete(ctx, netfilter.IPv6); err != nil {
		t.Fatalf("deleting the ip6 table: %v", err)
	}
	mustApply(t, r, snap, testPorts(), true)
	if r.Repairs() != 1 {
		t.Errorf("Repairs = %d after tampering, want 1", r.Repairs())
	}
	mustApply(t, r, snap, testPorts(), true)
	if r.Repairs() != 1 {
		t.Errorf("Repairs = %d after a clean full sync, want 1", r.Repairs())
	}
	if got := read(netfilter.IPv4); !maps.EqualFunc(got, want4, maps.Equal) {
		t.Errorf("the repair did not restore the ip table's elements")
	}
	if got := read(netfilter.IPv6); !maps.EqualFunc(got, want6, maps.Equal) {
		t.Errorf("the repair did not restore the ip6 table's elements")
	}

	if err := r.Cleanup(ctx); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if after := tablesIn(t, ns); !slices.Equal(after, before) {
		t.Errorf("tables after Cleanup %v, want %v", after, before)
	}
}
