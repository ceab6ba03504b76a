package ipvs

import (
	"errors"

	"github.com/svcproxy/svcproxy/iface"
	"github.com/svcproxy/svcproxy/netfilter"
)

// Errors callers branch on.
var (
	// ErrUnavailable: the kernel has no IPVS (the ip_vs module is neither
	// built in nor loadable). Mode selection falls back on it.
	ErrUnavailable = errors.New("IPVS is not available")
	// ErrNoLink: the network interface does not exist.
	ErrNoLink = iface.ErrNoLink
	// ErrNoSet: the named ipset does not exist (netfilter's, which
	// netfilter.Exec wraps).
	ErrNoSet = netfilter.ErrNoSet
	// ErrSetInUse: the ipset is still referenced by a rule (netfilter's).
	ErrSetInUse = netfilter.ErrSetInUse
)
