package ipvs

import "errors"

// Errors callers branch on.
var (
	// ErrUnavailable: the kernel has no IPVS (the ip_vs module is neither
	// built in nor loadable). Mode selection falls back on it.
	ErrUnavailable = errors.New("IPVS is not available")
	// ErrNoLink: the network interface does not exist.
	ErrNoLink = errors.New("no such interface")
	// ErrNoSet: the named ipset does not exist.
	ErrNoSet = errors.New("ipset does not exist")
	// ErrSetInUse: the ipset is still referenced by a rule (with the
	// nf_tables backend, references may be released shortly after the rule
	// is deleted).
	ErrSetInUse = errors.New("ipset is in use")
)
