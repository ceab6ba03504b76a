package firewall

import (
	"context"

	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/nftable"
)

// Table is the name of the firewall table in each family.
const Table = "svcproxy-firewall"

// The sets of each family's table. Keys are encoded with nftable's
// FrontendKey; an allowed element's Key is the frontend key followed by
// the first source address of a range, its End the same with the last.
const (
	// SetFirewalled holds address . protocol . port of each LoadBalancer
	// frontend whose sources are restricted.
	SetFirewalled = "firewalled"
	// SetAllowed holds address . protocol . port . source ranges: the
	// sources each firewalled frontend takes.
	SetAllowed = "allowed"
)

// Kernel is what the firewall needs of nf_tables, one family's table at a
// time.
type Kernel interface {
	// Write makes fam's table exist as the package documents it, holding
	// exactly elems, in one transaction.
	Write(ctx context.Context, fam netfilter.Family, elems []nftable.Element) error
	// Delete removes fam's table; a table that is not there is no error.
	Delete(ctx context.Context, fam netfilter.Family) error
}

// Netlink is the Kernel over nf_tables netlink in the named network
// namespace ns ("": this process's); on other systems Write fails.
func Netlink(ns string) Kernel { return newNetlink(ns) }
