//go:build linux

// Command nftlib measures the two Go nftables libraries svcproxy could
// build its nftables mode on, on the layout that mode will use, at the
// scale issue 14 sets: sigs.k8s.io/knftables (what kube-proxy uses: it
// writes `nft -f -` transactions through the nft binary) and
// github.com/google/nftables (netlink messages from Go, no exec, no
// parsing). Each builds, in a throwaway network namespace, the same table:
//
//	table ip svcproxy-nftlib {
//	  map eps { typeof ip daddr . tcp dport . numgen random mod 64 : ip daddr . tcp dport }
//	  chain prerouting { type nat hook prerouting priority dstnat;
//	    dnat ip to ip daddr . tcp dport . numgen random mod 64 map @eps }
//	}
//
// (the "flat slot map", the layout the project's nftables measurements
// found the only one whose changes stay small: each Service gets 64 slots
// filled round robin with its endpoints, so an endpoint change rewrites
// that Service's 64 elements and no chain), then times the first load of
// N Services × E endpoints, an endpoint change (one Service's 64 elements
// replaced in one transaction), a Service added and one removed.
// Libraries and operations are interleaved over rounds; medians and
// maxima are printed as a markdown table. It sends no traffic. Results and what they decide:
// docs/design/nftables-library.md.
//
//	go run ./bench/nftlib --services 10000 --rounds 3
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

const (
	table = "svcproxy-nftlib"
	slots = 64
)

var (
	services  = flag.Int("services", 10000, "Services")
	endpoints = flag.Int("endpoints", 10, "endpoints per Service")
	changes   = flag.Int("changes", 20, "endpoint changes and Service additions timed per library and round")
	rounds    = flag.Int("rounds", 3, "rounds (libraries interleaved)")
	chunk     = flag.Int("chunk", 2000, "google/nftables: elements per netlink batch on the first load (a batch must fit the socket's send buffer)")
	child     = flag.Bool("child", false, "internal: run the measurement inside the namespace")
)

func main() {
	flag.Parse()
	if !*child {
		os.Exit(parent())
	}
	if err := measure(); err != nil {
		fmt.Fprintln(os.Stderr, "nftlib:", err)
		os.Exit(1)
	}
}

// parent runs this program again inside a throwaway network namespace.
func parent() int {
	ns := fmt.Sprintf("svcproxy-nftlib-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "nftlib: creating namespace %s: %v: %s\n", ns, err, out)
		return 1
	}
	defer exec.Command("ip", "netns", "delete", ns).Run()
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "nftlib:", err)
		return 1
	}
	args := append([]string{"netns", "exec", ns, self, "-child"}, os.Args[1:]...)
	cmd := exec.Command("ip", args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return 1
	}
	return 0
}

// svc is one Service: its VIP and endpoints (port 80 → 8080).
type svc struct {
	vip netip.Addr
	eps []netip.Addr
}

func addr(base [2]byte, i int) netip.Addr {
	return netip.AddrFrom4([4]byte{base[0], base[1] + byte(i>>16), byte(i >> 8), byte(i)})
}

func makeServices(n, e int) []svc {
	out := make([]svc, n)
	for i := range out {
		out[i].vip = addr([2]byte{198, 19}, i+1)
		for j := range e {
			out[i].eps = append(out[i].eps, addr([2]byte{198, 18}, i*e+j+1))
		}
	}
	return out
}

// slot is the endpoint in slot k of s: round robin over its endpoints.
func (s svc) slot(k int) netip.Addr { return s.eps[k%len(s.eps)] }

// backend is one library's way of writing the table.
type backend interface {
	name() string
	load(ctx context.Context, all []svc) error
	// replace rewrites s's 64 elements (an endpoint change) in one
	// transaction; add adds a new Service's.
	replace(ctx context.Context, old, new svc) error
	add(ctx context.Context, s svc) error
	remove(ctx context.Context, s svc) error
	cleanup(ctx context.Context) error
}

func measure() error {
	ctx := context.Background()
	all := makeServices(*services, *endpoints)
	kn, err := newKnft()
	if err != nil {
		return err
	}
	gn, err := newGnft()
	if err != nil {
		return err
	}
	type samples struct{ load, change, add, remove []time.Duration }
	results := map[string]*samples{}
	libs := []backend{kn, gn}
	var listed = map[string]string{}
	for round := range *rounds {
		if round%2 == 1 {
			slices.Reverse(libs)
		}
		for _, b := range libs {
			r := results[b.name()]
			if r == nil {
				r = &samples{}
				results[b.name()] = r
			}
			_ = b.cleanup(ctx)
			t0 := time.Now()
			if err := b.load(ctx, all); err != nil {
				return fmt.Errorf("%s: first load: %w", b.name(), err)
			}
			r.load = append(r.load, time.Since(t0))
			rng := rand.New(rand.NewPCG(uint64(round), 1))
			for c := range *changes {
				old := all[rng.IntN(len(all))]
				next := old
				next.eps = slices.Clone(old.eps)
				next.eps[0] = addr([2]byte{198, 18}, 250000+c) // one endpoint replaced
				t0 = time.Now()
				if err := b.replace(ctx, old, next); err != nil {
					return fmt.Errorf("%s: endpoint change: %w", b.name(), err)
				}
				r.change = append(r.change, time.Since(t0))
				if err := b.replace(ctx, next, old); err != nil { // back, untimed
					return fmt.Errorf("%s: endpoint change back: %w", b.name(), err)
				}
				added := svc{vip: addr([2]byte{198, 19}, 200000+round*1000+c), eps: old.eps}
				t0 = time.Now()
				if err := b.add(ctx, added); err != nil {
					return fmt.Errorf("%s: adding a Service: %w", b.name(), err)
				}
				r.add = append(r.add, time.Since(t0))
				if c%2 == 1 { // every other added Service goes again
					t0 = time.Now()
					if err := b.remove(ctx, added); err != nil {
						return fmt.Errorf("%s: removing a Service: %w", b.name(), err)
					}
					r.remove = append(r.remove, time.Since(t0))
				}
			}
			if round == 0 {
				out, err := exec.Command("nft", "list", "chain", "ip", table, "prerouting").Output()
				if err != nil {
					return fmt.Errorf("%s: listing the rule: %w", b.name(), err)
				}
				listed[b.name()] = ruleLine(out)
				count, err := countElements()
				if err != nil {
					return err
				}
				if want := (len(all) + *changes - *changes/2) * slots; count != want {
					return fmt.Errorf("%s: the map holds %d elements, want %d", b.name(), count, want)
				}
			}
			if err := b.cleanup(ctx); err != nil {
				return fmt.Errorf("%s: cleanup: %w", b.name(), err)
			}
		}
	}
	if listed[kn.name()] != listed[gn.name()] {
		return fmt.Errorf("the two libraries wrote different rules:\n%s: %s\n%s: %s", kn.name(), listed[kn.name()], gn.name(), listed[gn.name()])
	}
	v, _ := exec.Command("nft", "--version").Output()
	k, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	fmt.Printf("%d Services × %d endpoints, %d slots each (%d map elements); %d rounds, libraries interleaved; %d changes and additions per library and round; %s, kernel %s\n\n",
		*services, *endpoints, slots, *services*slots, *rounds, *changes, strings.TrimSpace(string(v)), strings.TrimSpace(string(k)))
	fmt.Printf("rule both wrote: `%s`\n\n", listed[kn.name()])
	fmt.Println("| library | first load (median of rounds) | endpoint change p50 | p99 (max) | add a Service p50 | p99 (max) | remove a Service p50 | p99 (max) |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, b := range []backend{kn, gn} {
		r := results[b.name()]
		fmt.Printf("| %s | %v | %v | %v | %v | %v | %v | %v |\n", b.name(), med(r.load), med(r.change), max99(r.change),
			med(r.add), max99(r.add), med(r.remove), max99(r.remove))
	}
	return nil
}

func med(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2].Round(10 * time.Microsecond)
}

// max99 is the 99th percentile: with under 100 samples, the maximum.
func max99(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*99/100)].Round(10 * time.Microsecond)
}

func ruleLine(listing []byte) string {
	for line := range strings.Lines(string(listing)) {
		if l := strings.TrimSpace(line); strings.HasPrefix(l, "dnat ") {
			return l
		}
	}
	return ""
}

func countElements() (int, error) {
	out, err := exec.Command("nft", "-j", "list", "map", "ip", table, "eps").Output()
	if err != nil {
		return 0, fmt.Errorf("listing the map: %w", err)
	}
	return bytes.Count(out, []byte(`"concat"`)) / 2, nil // a key and a value each
}

// knft writes through sigs.k8s.io/knftables (the nft binary).
type knft struct{ nft knftables.Interface }

func newKnft() (*knft, error) {
	nft, err := knftables.New(knftables.IPv4Family, table)
	if err != nil {
		return nil, fmt.Errorf("knftables: %w", err)
	}
	return &knft{nft}, nil
}

func (k *knft) name() string { return "sigs.k8s.io/knftables v0.0.22 (nft exec)" }

func (k *knft) elements(tx *knftables.Transaction, s svc, del bool) {
	for i := range slots {
		e := &knftables.Element{Map: "eps", Key: []string{s.vip.String(), "80", fmt.Sprint(i)}, Value: []string{s.slot(i).String(), "8080"}}
		if del {
			tx.Delete(e)
		} else {
			tx.Add(e)
		}
	}
}

func (k *knft) load(ctx context.Context, all []svc) error {
	tx := k.nft.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Add(&knftables.Map{Name: "eps", TypeOf: fmt.Sprintf("ip daddr . tcp dport . numgen random mod %d : ip daddr . tcp dport", slots)})
	tx.Add(&knftables.Chain{Name: "prerouting", Type: knftables.PtrTo(knftables.NATType), Hook: knftables.PtrTo(knftables.PreroutingHook),
		Priority: knftables.PtrTo(knftables.DNATPriority)})
	tx.Add(&knftables.Rule{Chain: "prerouting", Rule: fmt.Sprintf("dnat ip to ip daddr . tcp dport . numgen random mod %d map @eps", slots)})
	for _, s := range all {
		k.elements(tx, s, false)
	}
	return k.nft.Run(ctx, tx)
}

func (k *knft) replace(ctx context.Context, old, new svc) error {
	tx := k.nft.NewTransaction()
	k.elements(tx, old, true)
	k.elements(tx, new, false)
	return k.nft.Run(ctx, tx)
}

func (k *knft) add(ctx context.Context, s svc) error {
	tx := k.nft.NewTransaction()
	k.elements(tx, s, false)
	return k.nft.Run(ctx, tx)
}

func (k *knft) remove(ctx context.Context, s svc) error {
	tx := k.nft.NewTransaction()
	k.elements(tx, s, true)
	return k.nft.Run(ctx, tx)
}

func (k *knft) cleanup(ctx context.Context) error {
	tx := k.nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	return k.nft.Run(ctx, tx)
}

// gnft writes through github.com/google/nftables (netlink from Go).
type gnft struct {
	c   *nftables.Conn
	t   *nftables.Table
	eps *nftables.Set
}

func newGnft() (*gnft, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("google/nftables: %w", err)
	}
	t := &nftables.Table{Name: table, Family: nftables.TableFamilyIPv4}
	eps := &nftables.Set{Table: t, Name: "eps", IsMap: true, Concatenation: true,
		KeyType:  nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService, nftables.TypeMark),
		DataType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService)}
	return &gnft{c: c, t: t, eps: eps}, nil
}

func (g *gnft) name() string { return "github.com/google/nftables v0.3.0 (netlink)" }

// elements are s's 64 map elements in the kernel's layout: each field
// padded to 4 bytes; addresses and ports in network order, the numgen
// value in host order.
func (g *gnft) elements(s svc) []nftables.SetElement {
	out := make([]nftables.SetElement, slots)
	for i := range out {
		key := make([]byte, 12)
		copy(key, s.vip.AsSlice())
		binary.BigEndian.PutUint16(key[4:], 80)
		binary.NativeEndian.PutUint32(key[8:], uint32(i))
		val := make([]byte, 8)
		copy(val, s.slot(i).AsSlice())
		binary.BigEndian.PutUint16(val[4:], 8080)
		out[i] = nftables.SetElement{Key: key, Val: val}
	}
	return out
}

func (g *gnft) load(ctx context.Context, all []svc) error {
	g.c.AddTable(g.t)
	if err := g.c.AddSet(g.eps, nil); err != nil {
		return err
	}
	ch := g.c.AddChain(&nftables.Chain{Name: "prerouting", Table: g.t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	g.c.AddRule(&nftables.Rule{Table: g.t, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Numgen{Register: 10, Modulus: slots, Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetName: g.eps.Name, SetID: g.eps.ID},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: 9, RegProtoMax: 9, Specified: true},
	}})
	if err := g.c.Flush(); err != nil {
		return err
	}
	// Netlink caps an attribute at 64 KiB and a batch at the socket's
	// send buffer: elements go in messages of 500, batches of *chunk.
	var batch int
	for _, s := range all {
		if err := g.c.SetAddElements(g.eps, g.elements(s)); err != nil {
			return err
		}
		if batch += slots; batch >= *chunk {
			if err := g.c.Flush(); err != nil {
				return err
			}
			batch = 0
		}
	}
	return g.c.Flush()
}

func (g *gnft) replace(ctx context.Context, old, new svc) error {
	if err := g.c.SetDeleteElements(g.eps, g.elements(old)); err != nil {
		return err
	}
	if err := g.c.SetAddElements(g.eps, g.elements(new)); err != nil {
		return err
	}
	return g.c.Flush()
}

func (g *gnft) add(ctx context.Context, s svc) error {
	if err := g.c.SetAddElements(g.eps, g.elements(s)); err != nil {
		return err
	}
	return g.c.Flush()
}

func (g *gnft) remove(ctx context.Context, s svc) error {
	if err := g.c.SetDeleteElements(g.eps, g.elements(s)); err != nil {
		return err
	}
	return g.c.Flush()
}

func (g *gnft) cleanup(ctx context.Context) error {
	g.c.DelTable(g.t)
	return g.c.Flush()
}
