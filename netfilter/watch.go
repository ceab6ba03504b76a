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
	// Own reports whether the process with this pid is one of this
	// process's own tool runs (Exec.Spawned): its commits are not
	// reported. Nil: every commit counts.
	Own func(pid uint32) bool
	// NetNS, when set, watches the named network namespace
	// (/run/netns/NetNS) instead of the caller's.
	NetNS string
}
