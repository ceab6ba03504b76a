package model

import (
	"errors"

	"github.com/svcproxy/svcproxy/lb"
)

// Family is an IP address family.
type Family uint8

// The families.
const (
	IPv4 Family = iota
	IPv6
)

func (f Family) String() string {
	if f == IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// ProtoName is p as iptables, ipset and conntrack name it: "tcp", "udp"
// or "sctp".
func ProtoName(p lb.Protocol) string {
	switch p {
	case lb.UDP:
		return "udp"
	case lb.SCTP:
		return "sctp"
	}
	return "tcp"
}

// Errors the ipset model wraps; netfilter re-exports them as the errors an
// Executor wraps.
var (
	// ErrNoSet: the named ipset does not exist.
	ErrNoSet = errors.New("ipset does not exist")
	// ErrSetInUse: the ipset is still referenced by a rule.
	ErrSetInUse = errors.New("ipset is in use")
)
