package nftable

// A change is the elements one nf_tables transaction deletes, then adds.
type change struct{ del, add []Element }

// plan splits a change of del and add into transactions of at most limit
// encoded bytes each (elementSize): one transaction whenever the whole
// change fits, so that no packet meets it half written. A larger change
// cannot be atomic; it is split so that each element stays whole and the
// intermediate states are the ones a reader of the tables can tolerate:
//
//   - an element whose value changes (deleted and added with the same set,
//     key and end) is deleted and re-added in the same transaction, never
//     missing between two;
//   - new elements come first, in the order given, so that what a changed
//     element will point to (a frontend's new slots, a chain's new
//     endpoints) is there before it does;
//   - then the changed elements, then the elements that go, in the order
//     given, once nothing changed points to them any more.
//
// A single element (or a changed one's pair) larger than limit still gets
// a transaction of its own.
func plan(del, add []Element, limit int) []change {
	if size(del)+size(add) <= limit {
		return []change{{del: del, add: add}}
	}
	type id struct{ set, key, end string }
	replaced := make(map[id]int, len(add)) // changed element → its index in add
	for i, e := range add {
		replaced[id{e.Set, e.Key, e.End}] = i
	}
	var pairs [][2]Element // deleted, added
	var gone []Element
	paired := make([]bool, len(add))
	for _, e := range del {
		if i, ok := replaced[id{e.Set, e.Key, e.End}]; ok && !paired[i] {
			paired[i] = true
			pairs = append(pairs, [2]Element{e, add[i]})
			continue
		}
		gone = append(gone, e)
	}

	var out []change
	cur, used := change{}, 0
	put := func(n int, f func(*change)) {
		if used > 0 && used+n > limit {
			out = append(out, cur)
			cur, used = change{}, 0
		}
		f(&cur)
		used += n
	}
	for i, e := range add {
		if !paired[i] {
			put(elementSize(e), func(c *change) { c.add = append(c.add, e) })
		}
	}
	for _, p := range pairs {
		put(elementSize(p[0])+elementSize(p[1]), func(c *change) {
			c.del = append(c.del, p[0])
			c.add = append(c.add, p[1])
		})
	}
	for _, e := range gone {
		put(elementSize(e), func(c *change) { c.del = append(c.del, e) })
	}
	if used > 0 {
		out = append(out, cur)
	}
	return out
}

// size is about what es take in netlink messages.
func size(es []Element) int {
	n := 0
	for _, e := range es {
		n += elementSize(e)
	}
	return n
}

// elementSize is about what e takes in a netlink message.
func elementSize(e Element) int { return len(e.Key) + len(e.Val) + len(e.End) + 48 } // attribute headers
