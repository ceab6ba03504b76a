package netfilter

import "github.com/svcproxy/svcproxy/netfilter/internal/model"

// Errors an Executor wraps so callers can branch on them.
var (
	// ErrNoSet: the named ipset does not exist.
	ErrNoSet = model.ErrNoSet
	// ErrSetInUse: the ipset is still referenced by a rule (with the
	// nf_tables backend, references may be released shortly after the rule
	// is deleted).
	ErrSetInUse = model.ErrSetInUse
)
