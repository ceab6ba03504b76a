//go:build linux

package nftable

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"testing"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

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

	// 10,001 elements: many messages, one transaction where the socket's
	// buffers take them (c.limit: a root without CAP_NET_ADMIN in the
	// initial user namespace gets rmem_max and wmem_max).
	gen := generation(t, ns)
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
	if n := generation(t, ns) - gen; (n == 1) != (size(add) <= c.limit) || n == 0 {
		t.Errorf("adding 10,001 elements (%d bytes) with a limit of %d bytes took %d transactions", size(add), c.limit, n)
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
	// Every value of the map changed at once: one transaction when it fits
	// the limit, several when the socket takes less (TestPlan checks that
	// each element's delete and re-add share one).
	limit := c.limit
	for _, tc := range []struct{ limit, port int }{{limit, 15003}, {64 << 10, 15004}} {
		c.limit = tc.limit
		old, _ := c.Elements(ctx, tb, "to")
		var del, add []Element
		for k, v := range old {
			del = append(del, Element{Set: "to", Key: k, Val: v})
			add = append(add, Element{Set: "to", Key: k, Val: PortValue(uint16(tc.port))})
		}
		gen := generation(t, ns)
		if err := c.Update(ctx, tb, del, add); err != nil {
			t.Fatalf("Update changing %d values with a limit of %d bytes: %v", len(del), tc.limit, err)
		}
		if n := generation(t, ns) - gen; (n == 1) != (size(del)+size(add) <= tc.limit) || n == 0 {
			t.Errorf("changing %d values (%d bytes) with a limit of %d bytes took %d transactions", len(del), size(del)+size(add), tc.limit, n)
		}
		got, _ := c.Elements(ctx, tb, "to")
		for k := range old {
			if got[k] != PortValue(uint16(tc.port)) {
				t.Fatalf("after changing every value with a limit of %d bytes, %x reads back %x", tc.limit, k, got[k])
			}
		}
	}
	// An element of an undeclared set is refused before anything is sent,
	// with elements of declared sets before it that would have gone in a
	// transaction of their own.
	c.limit = 1
	gen = generation(t, ns)
	if err := c.Update(ctx, tb, nil, []Element{{Set: "ports", Key: PortValue(40054)}, {Set: "nope", Key: "x"}}); err == nil {
		t.Error("Update of an undeclared set succeeded")
	}
	if g := generation(t, ns); g != gen {
		t.Errorf("an Update refused for an undeclared set committed %d transactions", g-gen)
	}
	c.limit = limit

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

// generation is the nf_tables ruleset generation of namespace ns, which
// every committed transaction moves on by one.
func generation(t *testing.T, ns string) uint32 {
	t.Helper()
	f, err := os.Open("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	nl, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(f.Fd())})
	if err != nil {
		t.Fatalf("dialing netfilter netlink: %v", err)
	}
	defer nl.Close()
	msgs, err := nl.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil || len(msgs) != 1 || len(msgs[0].Data) < 4 {
		t.Fatalf("reading the nf_tables generation: %v (%d replies)", err, len(msgs))
	}
	ad, err := netlink.NewAttributeDecoder(msgs[0].Data[4:])
	if err != nil {
		t.Fatalf("decoding the nf_tables generation: %v", err)
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		if ad.Type() == unix.NFTA_GEN_ID {
			return ad.Uint32()
		}
	}
	t.Fatal("the nf_tables generation reply holds no NFTA_GEN_ID")
	return 0
}

func netipFrom4(a, b, c, d byte) netip.Addr { return netip.AddrFrom4([4]byte{a, b, c, d}) }
