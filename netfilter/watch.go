package netfilter

// Table names one nf_tables table: iptables-nft keeps the iptables table
// "nat" of IPv4 as table nat of family ip, and so on.
type Table struct {
	Family Family
	Name   string
}

// WatchConfig says which changes WatchRuleset reports.
type WatchConfig struct {
	// Tables are the tables whose changes count. Empty: every table.
	Tables []Table
	// Chains, if set, narrows them to changes of the chains it accepts
	// (rules added, deleted or flushed, chains made or deleted); a whole
	// table deleted always counts. Nil: every change in the tables.
	Chains func(name string) bool
	// Own reports whether the process with this pid is one of this
	// process's own tool runs (Spawned): its commits are not reported.
	// Nil: every commit counts.
	Own func(pid uint32) bool
	// NetNS, when set, watches the named network namespace
	// (/run/netns/NetNS) instead of the caller's.
	NetNS string
}
