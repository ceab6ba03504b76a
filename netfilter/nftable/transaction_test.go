package nftable

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestPlan(t *testing.T) {
	e := func(set, key, val string) Element { return Element{Set: set, Key: key, Val: val} }
	size := elementSize(e("s", "k1", "v1")) // every element below is this size
	for _, tc := range []struct {
		name     string
		del, add []Element
		limit    int
		want     []change
	}{
		{name: "nothing", limit: size, want: []change{{}}},
		{
			name:  "fits: one transaction, as given",
			del:   []Element{e("a", "k1", "v1"), e("b", "k2", "")},
			add:   []Element{e("a", "k1", "v2"), e("a", "k3", "v3")},
			limit: 4 * size,
			want:  []change{{del: []Element{e("a", "k1", "v1"), e("b", "k2", "")}, add: []Element{e("a", "k1", "v2"), e("a", "k3", "v3")}}},
		},
		{
			name:  "too big: new, then changed (deleted and re-added together), then gone",
			del:   []Element{e("b", "k9", ""), e("a", "k1", "v1"), e("a", "k2", "v1")},
			add:   []Element{e("a", "k2", "v2"), e("c", "k5", "v5"), e("a", "k1", "v2")},
			limit: 3 * size,
			want: []change{
				{del: []Element{e("a", "k1", "v1")}, add: []Element{e("c", "k5", "v5"), e("a", "k1", "v2")}},
				{del: []Element{e("a", "k2", "v1"), e("b", "k9", "")}, add: []Element{e("a", "k2", "v2")}},
			},
		},
		{
			name:  "a changed element is never split from its re-add",
			del:   []Element{e("a", "k1", "v1"), e("a", "k2", "v1")},
			add:   []Element{e("a", "k1", "v2"), e("a", "k2", "v2")},
			limit: 3 * size,
			want: []change{
				{del: []Element{e("a", "k1", "v1")}, add: []Element{e("a", "k1", "v2")}},
				{del: []Element{e("a", "k2", "v1")}, add: []Element{e("a", "k2", "v2")}},
			},
		},
		{
			name:  "a pair larger than the limit gets its own transaction",
			del:   []Element{e("a", "k1", "v1")},
			add:   []Element{e("a", "k1", "v2"), e("a", "k3", "v3")},
			limit: size,
			want: []change{
				{add: []Element{e("a", "k3", "v3")}},
				{del: []Element{e("a", "k1", "v1")}, add: []Element{e("a", "k1", "v2")}},
			},
		},
		{
			name:  "same key in another set is not a change",
			del:   []Element{e("a", "k1", "v1")},
			add:   []Element{e("b", "k1", "v1")},
			limit: size,
			want:  []change{{add: []Element{e("b", "k1", "v1")}}, {del: []Element{e("a", "k1", "v1")}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := plan(tc.del, tc.add, tc.limit)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("plan =\n%v\nwant\n%v", got, tc.want)
			}
			checkPlan(t, tc.del, tc.add, tc.limit, got)
		})
	}
}

// FuzzPlan checks plan's promises on random changes: every element once,
// each changed element's delete and re-add in one transaction, new
// elements before changed ones before gone ones, each transaction within
// the limit unless it holds a single element or pair, one transaction
// when the whole change fits.
func FuzzPlan(f *testing.F) {
	f.Add(uint64(1), uint16(40), uint16(300))
	f.Add(uint64(2), uint16(400), uint16(5000))
	f.Fuzz(func(t *testing.T, seed uint64, n, limit uint16) {
		r := rand.New(rand.NewPCG(seed, seed>>1))
		var del, add []Element
		for i := range int(n % 512) {
			set := fmt.Sprint("s", r.IntN(3))
			key := fmt.Sprint(i)
			switch r.IntN(3) {
			case 0:
				del = append(del, Element{Set: set, Key: key, Val: "old"})
			case 1:
				add = append(add, Element{Set: set, Key: key, Val: "new"})
			default:
				del = append(del, Element{Set: set, Key: key, Val: "old"})
				add = append(add, Element{Set: set, Key: key, Val: "changed"})
			}
		}
		r.Shuffle(len(del), func(i, j int) { del[i], del[j] = del[j], del[i] })
		r.Shuffle(len(add), func(i, j int) { add[i], add[j] = add[j], add[i] })
		checkPlan(t, del, add, int(limit), plan(del, add, int(limit)))
	})
}

func checkPlan(t *testing.T, del, add []Element, limit int, got []change) {
	t.Helper()
	total := 0
	for _, e := range slices.Concat(del, add) {
		total += elementSize(e)
	}
	if total <= limit && len(got) != 1 {
		t.Fatalf("a change of %d bytes took %d transactions with a limit of %d", total, len(got), limit)
	}
	type id struct{ set, key string }
	delTx, addTx := map[id]int{}, map[id]int{}
	var gotDel, gotAdd []Element
	for i, tx := range got {
		n := 0
		for _, e := range tx.del {
			delTx[id{e.Set, e.Key}] = i
			n += elementSize(e)
		}
		for _, e := range tx.add {
			addTx[id{e.Set, e.Key}] = i
			n += elementSize(e)
		}
		alone := len(tx.del)+len(tx.add) == 1 ||
			len(tx.del) == 1 && len(tx.add) == 1 && tx.del[0].Set == tx.add[0].Set && tx.del[0].Key == tx.add[0].Key
		if n > limit && !alone {
			t.Errorf("transaction %d holds %d bytes, over the limit of %d", i, n, limit)
		}
		gotDel, gotAdd = append(gotDel, tx.del...), append(gotAdd, tx.add...)
	}
	sorted := func(es []Element) []Element { return slices.SortedFunc(slices.Values(es), cmpElement) }
	if !slices.Equal(sorted(gotDel), sorted(del)) || !slices.Equal(sorted(gotAdd), sorted(add)) {
		t.Fatalf("the transactions do not hold exactly the change")
	}
	// Phase of each transaction's elements: 0 new, 1 changed, 2 gone.
	last := 0
	for i, tx := range got {
		phase := func(k id, deleting bool) int {
			_, d := delTx[k]
			_, a := addTx[k]
			switch {
			case d && a:
				if delTx[k] != addTx[k] {
					t.Errorf("%v is deleted in transaction %d and re-added in %d", k, delTx[k], addTx[k])
				}
				return 1
			case deleting:
				return 2
			}
			return 0
		}
		var phases []int
		for _, e := range tx.add {
			phases = append(phases, phase(id{e.Set, e.Key}, false))
		}
		for _, e := range tx.del {
			phases = append(phases, phase(id{e.Set, e.Key}, true))
		}
		slices.Sort(phases)
		if len(phases) > 0 {
			if phases[0] < last {
				t.Errorf("transaction %d holds phase %d after phase %d", i, phases[0], last)
			}
			last = phases[len(phases)-1]
		}
	}
}

func cmpElement(a, b Element) int {
	for _, c := range [][2]string{{a.Set, b.Set}, {a.Key, b.Key}, {a.Val, b.Val}, {a.End, b.End}} {
		if c[0] != c[1] {
			if c[0] < c[1] {
				return -1
			}
			return 1
		}
	}
	return 0
}
