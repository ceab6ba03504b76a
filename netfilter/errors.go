package netfilter

import "errors"

// Errors an Executor wraps so callers can branch on them.
var (
	// ErrNoSet: the named ipset does not exist.
	ErrNoSet = errors.New("ipset does not exist")
	// ErrSetInUse: the ipset is still referenced by a rule (with the
	// nf_tables backend, references may be released shortly after the rule
	// is deleted).
	ErrSetInUse = errors.New("ipset is in use")
)
