package lb

// Maglev consistent hashing (Eisenbud et al., NSDI 2016): every backend
// fills slots of a prime-sized lookup table in its own permutation order,
// taking turns, so each owns an almost equal share and removing one backend
// moves only the clients that were on it.

// maglevTableSize is the prime size of every lookup table. One size for
// every pool keeps a table stable when its backend count changes (a size
// that grew with the count would move most clients whenever it stepped);
// it is under 1% imbalance up to about 160 backends, as the paper advises
// (at least 100 slots per backend), and 32 KiB per Maglev pool.
const maglevTableSize = 16381

// maglevTable builds the lookup table for backends, which must be sorted by
// address (pools keep them so); entries are indexes into backends. It
// depends only on the addresses, so every node builds the same table.
func maglevTable(backends []*Backend) []uint16 {
	n := len(backends)
	if n == 0 {
		return nil
	}
	m := uint64(maglevTableSize)
	offset := make([]uint64, n)
	skip := make([]uint64, n)
	for i, b := range backends {
		key := b.Addr.String()
		offset[i] = fnv64(key, 0xcbf29ce484222325) % m
		skip[i] = fnv64(key, 0x84222325cbf29ce4)%(m-1) + 1
	}
	const empty = ^uint16(0)
	table := make([]uint16, m)
	for i := range table {
		table[i] = empty
	}
	next := make([]uint64, n)
	filled := uint64(0)
	for {
		for i := range backends {
			c := (offset[i] + next[i]*skip[i]) % m
			for table[c] != empty {
				next[i]++
				c = (offset[i] + next[i]*skip[i]) % m
			}
			table[c] = uint16(i)
			next[i]++
			filled++
			if filled == m {
				return table
			}
		}
	}
}

func fnv64(s string, basis uint64) uint64 {
	h := basis
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}
