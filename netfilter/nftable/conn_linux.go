package nftable

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/netfilter"
)

// Table declares one owned table of one family: everything but its
// elements.
type Table struct {
	Name   string
	Family netfilter.Family
	// Sets, in the order they are created. Their Table field is ignored.
	Sets []*nft.Set
	// Chains, in the order they are created (a base chain carries its
	// hook). Their Table field is ignored.
	Chains []*nft.Chain
	// Rules are each chain's rules, by chain name.
	Rules map[string][][]expr.Any
}

// Netlink caps an attribute at 64 KiB and a batch (one sendmsg) at the
// socket's send buffer: elements go 64 to a message, and a transaction
// holds up to transactionBytes of them (about 50,000 IPv4 elements; half
// the buffers bigBuffers asks for), less on a socket that could not have
// those (bigBuffers says how much).
const (
	elementsPerMessage = 64
	transactionBytes   = 4 << 20
)

func (t *Table) table() *nft.Table {
	f := nft.TableFamilyIPv4
	if t.Family == netfilter.IPv6 {
		f = nft.TableFamilyIPv6
	}
	return &nft.Table{Name: t.Name, Family: f}
}

// set is the declared set name, in table nt; nil when t has none.
func (t *Table) set(nt *nft.Table, name string) *nft.Set {
	for _, s := range t.Sets {
		if s.Name == name {
			c := *s
			c.Table = nt
			return &c
		}
	}
	return nil
}

// AddrType is the set data type of an address of fam.
func AddrType(fam netfilter.Family) nft.SetDatatype {
	if fam == netfilter.IPv6 {
		return nft.TypeIP6Addr
	}
	return nft.TypeIPAddr
}

// Conn is one lasting nf_tables netlink socket, opened on first use in a
// named network namespace ("": the process's). Opening and closing a
// socket per transaction cost 12–15 ms each (closing one after deleting
// elements waits for the kernel), most of an endpoint change. Its methods
// are safe for concurrent use; calls are serialised.
type Conn struct {
	ns    string
	mu    sync.Mutex
	c     *nft.Conn
	limit int // bytes of elements a transaction may hold on c
}

// NewConn returns a Conn for network namespace ns.
func NewConn(ns string) *Conn { return &Conn{ns: ns} }

// conn returns the socket, opening it if it is not open. The caller holds
// k.mu.
func (k *Conn) conn() (*nft.Conn, error) {
	if k.c != nil {
		return k.c, nil
	}
	opts := []nft.ConnOption{nft.AsLasting(), nft.WithSockOptions(func(c *netlink.Conn) error {
		k.limit = bigBuffers(c)
		return nil
	})}
	if k.ns != "" {
		f, err := os.Open("/run/netns/" + k.ns)
		if err != nil {
			return nil, fmt.Errorf("opening network namespace %s: %w", k.ns, err)
		}
		defer f.Close() // the socket keeps its namespace
		opts = append(opts, nft.WithNetNSFd(int(f.Fd())))
	}
	c, err := nft.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("opening an nf_tables netlink socket: %w", err)
	}
	k.c = c
	return c, nil
}

// socketBuffer is the socket's send and receive buffers: a batch is one
// sendmsg, and the kernel acks each of its messages at once; a table's
// setup (hundreds of chains, rules and sets) or a large element update
// overflows the default 208 KiB (EMSGSIZE sending, ENOBUFS receiving).
const socketBuffer = 8 << 20

// bigBuffers raises the socket's buffers to socketBuffer, past
// net.core.[rw]mem_max when allowed (SO_*BUFFORCE need CAP_NET_ADMIN in
// the initial user namespace, which a container's root may lack), and
// returns how many bytes of elements a transaction may then hold, from the
// buffers the socket got (as the kernel reports them: what it charges,
// twice what was asked), at most transactionBytes:
//   - half the send buffer, leaving room for the messages' own headers;
//   - twice the receive buffer: the kernel queues an ack of about 768 bytes
//     (what it charges) for each message of up to 64 elements of at least
//     52 bytes while the batch is still being sent, under a quarter of the
//     elements' bytes.
//
// Without the forced sizes each is capped apart, at wmem_max and rmem_max.
func bigBuffers(c *netlink.Conn) int {
	raw, err := c.SyscallConn()
	if err != nil {
		return fallbackBytes
	}
	sndbuf, rcvbuf := 0, 0
	if err := raw.Control(func(fd uintptr) {
		if errors.Join(unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, socketBuffer),
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, socketBuffer)) != nil {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, socketBuffer)
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, socketBuffer)
		}
		sndbuf, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
		rcvbuf, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
	}); err != nil || sndbuf <= 0 || rcvbuf <= 0 {
		return fallbackBytes
	}
	return min(transactionBytes, sndbuf/2, rcvbuf*2)
}

// fallbackBytes is the limit when the buffers cannot be read: what fits
// the kernel's defaults (net.core.[rw]mem_default, 208 KiB).
const fallbackBytes = 96 << 10

// dial locks k and returns its socket; done unlocks, first closing the
// socket if the call failed (a batch half sent or a broken socket is not
// reused).
func (k *Conn) dial() (*nft.Conn, func(*error), error) {
	k.mu.Lock()
	c, err := k.conn()
	if err != nil {
		k.mu.Unlock()
		return nil, nil, err
	}
	return c, func(err *error) {
		if *err != nil {
			_ = k.c.CloseLasting()
			k.c = nil
		}
		k.mu.Unlock()
	}, nil
}

// Close closes the socket; the next call opens another.
func (k *Conn) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.c == nil {
		return nil
	}
	err := k.c.CloseLasting()
	k.c = nil
	return err
}

// Setup checks what is there, then adds the table, sets and chains (a no-op
// for those that exist), flushes the chains, deletes the sets t does not
// declare and writes the chains' rules, in one transaction, leaving the
// elements of the declared sets alone. A declared set that exists with
// another type (an older layout) makes it start over with a new table.
// intact says the table held every declared set and chain with as many
// rules as declared, and no other set; an intact table is left as it is
// unless rewrite is set. (Rewriting rules makes the kernel validate the
// chain graph again, every element of a verdict map included: 0.8 s for
// the nftables mode's table at 10,000 Services.)
func (k *Conn) Setup(ctx context.Context, t Table, rewrite bool) (intact bool, err error) {
	c, done, err := k.dial()
	if err != nil {
		return false, err
	}
	defer done(&err)
	nt := t.table()
	var stale []string
	intact = true
	if _, err := c.ListTableOfFamily(t.Name, nt.Family); err != nil {
		intact = false
	} else {
		sets, err := c.GetSets(nt)
		if err != nil {
			return false, fmt.Errorf("listing sets: %w", err)
		}
		have := map[string]*nft.Set{}
		for _, s := range sets {
			have[s.Name] = s
			if t.set(nt, s.Name) == nil {
				stale = append(stale, s.Name)
				intact = false
			}
		}
		for _, w := range t.Sets {
			s := have[w.Name]
			if s == nil {
				intact = false
				continue
			}
			if !sameType(s, w) {
				// An older layout: start over.
				c.DelTable(nt)
				if err := c.Flush(); err != nil {
					return false, fmt.Errorf("deleting a table of another layout: %w", err)
				}
				intact, stale = false, nil
				break
			}
		}
		if intact {
			for _, ch := range t.Chains {
				rs, err := c.GetRules(nt, &nft.Chain{Name: ch.Name, Table: nt})
				if err != nil || len(rs) != len(t.Rules[ch.Name]) {
					intact = false
					break
				}
			}
		}
	}
	if intact && !rewrite {
		return true, nil
	}
	if err := write(c, t, nt, stale); err != nil {
		return false, fmt.Errorf("writing table %s: %w", t.Name, err)
	}
	return intact, nil
}

// sameType says set s read back from the kernel has the type declared in
// w. google/nftables v0.3.0 decodes a verdict map's data type into its
// KeyType (losing the key's length), so a verdict map is only checked to
// be one.
func sameType(s, w *nft.Set) bool {
	if isVmap(w) {
		return s.IsMap && s.KeyType.Name == nft.TypeVerdict.Name
	}
	return s.KeyType.Bytes == w.KeyType.Bytes && s.IsMap == w.IsMap && (!s.IsMap || s.DataType.Bytes == w.DataType.Bytes)
}

// write queues t's table, sets, chains and rules in nt (flushing the
// chains first and deleting the stale sets) and flushes the batch.
func write(c *nft.Conn, t Table, nt *nft.Table, stale []string) error {
	if err := queue(c, t, nt, stale); err != nil {
		return err
	}
	return c.Flush()
}

// queue queues what write writes, and flushes nothing.
func queue(c *nft.Conn, t Table, nt *nft.Table, stale []string) error {
	c.AddTable(nt)
	for _, s := range t.Sets {
		if err := c.AddSet(t.set(nt, s.Name), nil); err != nil {
			return fmt.Errorf("adding set %s: %w", s.Name, err)
		}
	}
	chains := make([]*nft.Chain, len(t.Chains))
	for i, ch := range t.Chains {
		cc := *ch
		cc.Table = nt
		chains[i] = &cc
		c.AddChain(chains[i])
	}
	for _, ch := range chains {
		c.FlushChain(ch)
	}
	for _, name := range stale { // no rule refers to them once the chains are flushed
		c.DelSet(&nft.Set{Table: nt, Name: name})
	}
	for _, ch := range chains {
		for _, ex := range t.Rules[ch.Name] {
			c.AddRule(&nft.Rule{Table: nt, Chain: ch, Exprs: ex})
		}
	}
	return nil
}

// Replace makes t exactly as declared, holding exactly elems, in one
// transaction: the table is deleted (if there) and written anew, so no
// packet meets it half written, and nothing of an earlier layout or
// content is left. For small tables: the whole table and every element go
// in one batch, and elements of more than a transaction holds (about
// 50,000 IPv4 ones, see transactionBytes) are refused.
func (k *Conn) Replace(ctx context.Context, t Table, elems []Element) (err error) {
	if err := undeclared(t, elems); err != nil {
		return fmt.Errorf("writing table %s: %w", t.Name, err)
	}
	c, done, err := k.dial()
	if err != nil {
		return err
	}
	if n := size(elems); n > k.limit {
		var kept error // a refusal: the socket stays open
		done(&kept)
		return fmt.Errorf("writing table %s: %d elements (%d bytes) are more than one transaction takes (%d bytes)", t.Name, len(elems), n, k.limit)
	}
	defer done(&err)
	nt := t.table()
	c.AddTable(nt) // so that deleting it cannot fail
	c.DelTable(nt)
	if err := queue(c, t, nt, nil); err != nil {
		return fmt.Errorf("writing table %s: %w", t.Name, err)
	}
	if err := messages(t, nt, elems, c.SetAddElements); err != nil {
		return fmt.Errorf("adding elements to table %s: %w", t.Name, err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("writing table %s: %w", t.Name, err)
	}
	return nil
}

// setElement is e as an element of s.
func setElement(s *nft.Set, e Element) nft.SetElement {
	el := nft.SetElement{Key: []byte(e.Key), Val: []byte(e.Val)}
	if e.End != "" {
		el.KeyEnd = []byte(e.End)
	}
	if isVmap(s) {
		el.Val, el.VerdictData = nil, &expr.Verdict{Kind: expr.VerdictGoto, Chain: e.Val}
	}
	return el
}

// isVmap says s maps to verdicts: an Element's Val is then the chain to
// goto.
func isVmap(s *nft.Set) bool { return s.IsMap && s.DataType.Name == nft.TypeVerdict.Name }

// verdictChain decodes the chain of a verdict map element's data, as the
// kernel sends it (NFTA_VERDICT_CODE, NFTA_VERDICT_CHAIN).
func verdictChain(b []byte) string {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return ""
	}
	for ad.Next() {
		if ad.Type() == unix.NFTA_VERDICT_CHAIN {
			return strings.TrimRight(string(ad.Bytes()), "\x00")
		}
	}
	return ""
}

// Elements reads set's elements back: encoded key → encoded value ("" in a
// set that is not a map; the chain a verdict map element goes to).
func (k *Conn) Elements(ctx context.Context, t Table, set string) (_ map[string]string, err error) {
	s := t.set(t.table(), set)
	if s == nil {
		return nil, fmt.Errorf("reading set %s: table %s declares no such set", set, t.Name)
	}
	c, done, err := k.dial()
	if err != nil {
		return nil, err
	}
	defer done(&err)
	got, err := c.GetSetElements(s)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(got))
	vmap := isVmap(s)
	for _, e := range got {
		if vmap {
			out[string(e.Key)] = verdictChain(e.Val)
			continue
		}
		out[string(e.Key)] = string(e.Val)
	}
	return out, nil
}

// Update deletes, then adds, elements of t's sets: in one transaction
// when the change fits one (up to about 50,000 elements, see
// transactionBytes), so that no packet meets it half written; a larger
// one in as few as fit, split as plan says.
func (k *Conn) Update(ctx context.Context, t Table, del, add []Element) (err error) {
	if len(del)+len(add) == 0 {
		return nil
	}
	if err := undeclared(t, del, add); err != nil { // before anything is sent
		return fmt.Errorf("writing elements: %w", err)
	}
	c, done, err := k.dial()
	if err != nil {
		return err
	}
	defer done(&err)
	nt := t.table()
	for _, tx := range plan(del, add, k.limit) {
		if err := messages(t, nt, tx.del, c.SetDeleteElements); err != nil {
			return fmt.Errorf("deleting elements: %w", err)
		}
		if err := messages(t, nt, tx.add, c.SetAddElements); err != nil {
			return fmt.Errorf("adding elements: %w", err)
		}
		if err := c.Flush(); err != nil {
			return fmt.Errorf("writing elements: %w", err)
		}
	}
	return nil
}

// undeclared reports an element of a set t does not declare.
func undeclared(t Table, ess ...[]Element) error {
	nt := t.table()
	known := map[string]bool{}
	for _, es := range ess {
		for _, e := range es {
			if known[e.Set] {
				continue
			}
			if t.set(nt, e.Set) == nil {
				return fmt.Errorf("table %s declares no set %s", t.Name, e.Set)
			}
			known[e.Set] = true
		}
	}
	return nil
}

// messages calls f with es as netlink messages: one per run of up to
// elementsPerMessage elements of one set (grouped by set, a change of many
// sets does not cost a message per element).
func messages(t Table, nt *nft.Table, es []Element, f func(s *nft.Set, batch []nft.SetElement) error) error {
	es = bySet(es)
	for len(es) > 0 {
		name := es[0].Set
		s := t.set(nt, name)
		if s == nil {
			return fmt.Errorf("table %s declares no set %s", t.Name, name)
		}
		var batch []nft.SetElement
		for len(es) > 0 && es[0].Set == name && len(batch) < elementsPerMessage {
			batch = append(batch, setElement(s, es[0]))
			es = es[1:]
		}
		if err := f(s, batch); err != nil {
			return err
		}
	}
	return nil
}

// bySet is es with each set's elements together, sets in the order they
// first appear, each set's elements in their order (O(len(es))).
func bySet(es []Element) []Element {
	// Most calls are grouped already (one set, or elements built set by
	// set): check that first, copying nothing.
	ended := map[string]bool{} // sets whose run is over
	grouped := true
	for i := 1; i < len(es) && grouped; i++ {
		if es[i].Set != es[i-1].Set {
			ended[es[i-1].Set] = true
			grouped = !ended[es[i].Set]
		}
	}
	if grouped {
		return es
	}
	var order []string
	sets := map[string][]Element{}
	for _, e := range es {
		if _, ok := sets[e.Set]; !ok {
			order = append(order, e.Set)
		}
		sets[e.Set] = append(sets[e.Set], e)
	}
	out := make([]Element, 0, len(es))
	for _, name := range order {
		out = append(out, sets[name]...)
	}
	return out
}

// Delete removes the table name of fam; one that is not there is no error.
func (k *Conn) Delete(ctx context.Context, fam netfilter.Family, name string) (err error) {
	c, done, err := k.dial()
	if err != nil {
		return err
	}
	defer done(&err)
	nt := (&Table{Name: name, Family: fam}).table()
	if _, err := c.ListTableOfFamily(name, nt.Family); err != nil {
		return nil // not there
	}
	c.DelTable(nt)
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Probe writes t as a throwaway table (its name suffixed -probe) and
// deletes it: an error says the kernel does not take t (no nf_tables, a
// missing expression, no permission).
func (k *Conn) Probe(ctx context.Context, t Table) (err error) {
	c, done, err := k.dial()
	if err != nil {
		return err
	}
	defer done(&err)
	t.Name += "-probe"
	nt := t.table()
	err = write(c, t, nt, nil)
	c.DelTable(nt)
	if derr := c.Flush(); err == nil && derr != nil {
		err = derr
	}
	if err != nil {
		return fmt.Errorf("writing a throwaway table %s: %w", t.Name, err)
	}
	return nil
}

// ListTables lists the nftables tables of network namespace ns ("": this
// process's) as `nft list tables` prints them ("table ip svcproxy"), over
// netlink: the nft tool reads every set's elements into its cache first,
// which takes seconds with a large table (29 s with 680,000 elements).
func ListTables(ns string) ([]string, error) {
	k := NewConn(ns)
	defer k.Close()
	c, done, err := k.dial()
	if err != nil {
		return nil, err
	}
	defer done(&err)
	ts, err := c.ListTables()
	if err != nil {
		return nil, fmt.Errorf("listing tables: %w", err)
	}
	names := map[nft.TableFamily]string{nft.TableFamilyIPv4: "ip", nft.TableFamilyIPv6: "ip6", nft.TableFamilyINet: "inet",
		nft.TableFamilyARP: "arp", nft.TableFamilyBridge: "bridge", nft.TableFamilyNetdev: "netdev"}
	out := make([]string, 0, len(ts))
	for _, t := range ts {
		fam, ok := names[t.Family]
		if !ok {
			fam = fmt.Sprint(t.Family)
		}
		out = append(out, "table "+fam+" "+t.Name)
	}
	return out, nil
}
