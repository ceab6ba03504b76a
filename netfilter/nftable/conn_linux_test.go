//go:build linux

package nftable

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/svcproxy/svcproxy/internal/kerneltest"
	"github.com/svcproxy/svcproxy/netfilter"
)

var privileged = kerneltest.Gate{
	Package: "./netfilter/nftable/",
	Prefix:  "svcproxy-nftable-test-",
	Tools:   []string{"ip"},
	Probe: func(ns string) error {
		if err := NewConn(ns).Probe(context.Background(), testTable(netfilter.IPv4, false)); err != nil {
			return fmt.Errorf("this kernel does not take an nftables table with a map, a verdict map and NAT: %w", err)
		}
		return nil
	},
}

// testTable is a small table with a set, a map, a verdict map and a rule
// per chain; extra adds a set.
func testTable(fam netfilter.Family, extra bool) Table {
	fe, _ := Frontend(fam)
	t := Table{
		Name: "svcproxy-nftable-test", Family: fam,
		Sets: []*nft.Set{
			{Name: "ports", KeyType: nft.TypeInetService},
			{Name: "to", IsMap: true, Concatenation: true, KeyType: nft.MustConcatSetType(AddrType(fam), nft.TypeInetProto, nft.TypeInetService), DataType: nft.TypeInetService},
			{Name: "go", IsMap: true, Concatenation: true, KeyType: nft.MustConcatSetType(AddrType(fam), nft.TypeInetProto, nft.TypeInetService), DataType: nft.TypeVerdict},
		},
		Chains: []*nft.Chain{
			{Name: "target"},
			{Name: "pre", Type: nft.ChainTypeNAT, Hooknum: nft.ChainHookPrerouting, Priority: nft.ChainPriorityNATDest},
		},
		Rules: map[string][][]expr.Any{
			"target": {Cat(fe, []expr.Any{MapTo("to"), &expr.Redir{RegisterProtoMin: Reg1}})},
			"pre":    {Cat(fe, []expr.Any{Vmap("go")})},
		},
	}
	if extra {
		t.Sets = append(t.Sets, &nft.Set{Name: "extra", KeyType: nft.TypeInetService})
	}
	return t
}

func TestPrivilegedConn(t *testing.T) {
	privileged.Require(t)
	ctx := context.Background()
	ns := privileged.NewNS(t)
	c := NewConn(ns)
	defer c.Close()
	fam := netfilter.IPv4
	tb := testTable(fam, true)

	if intact, err := c.Setup(ctx, tb, false); err != nil || intact {
		t.Fatalf("first Setup = %v, %v; want not intact, nil", intact, err)
	}
	if intact, err := c.Setup(ctx, tb, false); err != nil || !intact {
		t.Fatalf("second Setup = %v, %v; want intact", intact, err)
	}
	if ts, err := ListTables(ns); err != nil || !slices.Contains(ts, "table ip "+tb.Name) {
		t.Errorf("ListTables = %q, %v; want it to hold table ip %s", ts, err, tb.Name)
	}

	// 5,000 elements: more than one batch and many messages.
	var add []Element
	want := map[string]map[string]string{"ports": {}, "to": {}, "go": {}}
	for i := range 5000 {
		a := netipFrom4(10, 96, byte(i>>8), byte(i))
		k := FrontendKey(a, 6, 80)
		add = append(add, Element{Set: "to", Key: k, Val: PortValue(15001)}, Element{Set: "go", Key: k, Val: "target"})
		want["to"][k], want["go"][k] = PortValue(15001), "target"
	}
	add = append(add, Element{Set: "ports", Key: PortValue(40053)})
	want["ports"][PortValue(40053)] = ""
	if err := c.Update(ctx, tb, nil, add); err != nil {
		t.Fatalf("Update: %v", err)
	}
	for set, w := range want {
		got, err := c.Elements(ctx, tb, set)
		if err != nil {
			t.Fatalf("Elements(%s): %v", set, err)
		}
		if !maps.Equal(got, w) {
			t.Errorf("set %s read back %d elements, want %d (equal: %v)", set, len(got), len(w), maps.Equal(got, w))
		}
	}
	// Deleting and re-adding with another value.
	k := add[0].Key
	if err := c.Update(ctx, tb, []Element{add[0]}, []Element{{Set: "to", Key: k, Val: PortValue(15002)}}); err != nil {
		t.Fatalf("Update changing a value: %v", err)
	}
	if got, _ := c.Elements(ctx, tb, "to"); got[k] != PortValue(15002) {
		t.Errorf("changed value reads back %x", got[k])
	}
	// An element of an undeclared set is refused before anything is sent.
	if err := c.Update(ctx, tb, nil, []Element{{Set: "nope", Key: "x"}}); err == nil {
		t.Error("Update of an undeclared set succeeded")
	}

	// A set no longer declared is deleted (the table is not intact), the
	// others keep their elements.
	small := testTable(fam, false)
	if intact, err := c.Setup(ctx, small, false); err != nil || intact {
		t.Fatalf("Setup without the extra set = %v, %v; want not intact", intact, err)
	}
	if got, err := c.Elements(ctx, small, "go"); err != nil || len(got) != 5000 {
		t.Errorf("after dropping a set, the verdict map holds %d elements (%v), want 5000", len(got), err)
	}
	// A set whose type changed: the table starts over.
	changed := testTable(fam, false)
	changed.Sets[0] = &nft.Set{Name: "ports", KeyType: nft.TypeIPAddr}
	if intact, err := c.Setup(ctx, changed, false); err != nil || intact {
		t.Fatalf("Setup of a changed set type = %v, %v; want not intact", intact, err)
	}
	if got, err := c.Elements(ctx, changed, "to"); err != nil || len(got) != 0 {
		t.Errorf("after a type change the map holds %d elements (%v), want a new, empty table", len(got), err)
	}

	if err := c.Delete(ctx, fam, tb.Name); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := c.Delete(ctx, fam, tb.Name); err != nil {
		t.Errorf("Delete of a table not there: %v", err)
	}
	if _, err := c.Elements(ctx, tb, "to"); err == nil {
		t.Error("the table is still there after Delete")
	}
}

func netipFrom4(a, b, c, d byte) netip.Addr { return netip.AddrFrom4([4]byte{a, b, c, d}) }
