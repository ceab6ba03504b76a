package ipvs

import (
	"context"
	"net/netip"

	"github.com/vishvananda/netns"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/iface"
	"github.com/svcproxy/svcproxy/netfilter"
)

// The kernel boundaries. Each interface is exactly what Mode calls; the real
// implementations are NewIPVS (moby/ipvs), NewLinks (vishvananda/netlink),
// Exec (iptables-restore, ipset), conntrack.NewNetlink (ctnetlink) and
// sysctl.Files (/proc/sys); the in-memory fakes are in package ipvstest.

// IPVS is the subset of *ipvs.Handle (github.com/moby/ipvs) Mode calls. The
// kernel reports errors as syscall.Errno: EEXIST when creating what exists,
// ESRCH for a missing virtual service, ENOENT for a missing real server or
// an unknown scheduler. Service, Destination and Timeouts are moby/ipvs's
// own types on Linux (types_linux.go), and a mirror of them elsewhere, where
// only the fakes implement IPVS.
type IPVS interface {
	GetServices() ([]*Service, error)
	NewService(*Service) error
	UpdateService(*Service) error
	DelService(*Service) error
	GetDestinations(*Service) ([]*Destination, error)
	NewDestination(*Service, *Destination) error
	UpdateDestination(*Service, *Destination) error
	DelDestination(*Service, *Destination) error
	// GetConfig reads the network namespace's connection timeouts (whole
	// seconds); SetConfig sets those that are not zero and leaves the
	// rest (ipvsadm --set).
	GetConfig() (*Timeouts, error)
	SetConfig(*Timeouts) error
}

// Links manages the dummy interface that holds the virtual IPs and reads the
// node's addresses: package iface's boundary, shared with local steering.
type Links = iface.Links

// NetlinkLinks is the real Links, over rtnetlink (package iface).
type NetlinkLinks = iface.Netlink

// NewLinks opens an rtnetlink socket in network namespace ns
// (netns.None(): the caller's); it fails where there is no rtnetlink.
func NewLinks(ns netns.NsHandle) (*NetlinkLinks, error) { return iface.New(ns) }

// Rules runs iptables-restore/-save and ipset: the whole rule set of a
// family in one iptables-restore, set contents in one ipset restore.
//
// *netfilter.Exec is the real one, *netfiltertest.Fake the in-memory one.
type Rules interface {
	// IPTablesRestore feeds data to iptables-restore (ip6tables-restore
	// for IPv6) with --noflush --wait: only the chains data declares are
	// flushed.
	IPTablesRestore(ctx context.Context, family Family, data []byte) error
	// IPTablesSave returns `iptables-save -t table` (ip6tables-save for
	// IPv6).
	IPTablesSave(ctx context.Context, family Family, table string) ([]byte, error)
	// IPTablesVersion returns `iptables --version`, e.g.
	// "iptables v1.8.9 (legacy)".
	IPTablesVersion(ctx context.Context) (string, error)
	// IPSetRestore feeds data to `ipset -exist restore`: creating a set
	// that exists with the same type, adding a member that is there and
	// deleting one that is not are no-ops. Lines apply in order; the first
	// failing line stops it.
	IPSetRestore(ctx context.Context, data []byte) error
	// IPSetSave returns `ipset save`: create and add lines of every set.
	IPSetSave(ctx context.Context) ([]byte, error)
	// IPSetDestroy destroys the named set: ErrNoSet when it does not
	// exist, ErrSetInUse when a rule still references it.
	IPSetDestroy(ctx context.Context, name string) error
}

// Conntrack deletes connection-tracking entries: conntrack.Table, whose
// real one is conntrack.NewNetlink.
type Conntrack = conntrack.Table

// Sysctls reads and writes kernel parameters, named as under /proc/sys
// ("net/ipv4/vs/conntrack").
type Sysctls interface {
	Sysctl(name string) (string, error)
	SetSysctl(name, value string) error
}

// Family is an IP address family: netfilter's, so *netfilter.Exec is the
// real Rules.
type Family = netfilter.Family

// The families. IPv4 is always programmed; IPv6 when Config.IPv6 is set.
const (
	IPv4 = netfilter.IPv4
	IPv6 = netfilter.IPv6
)

func familyOf(a netip.Addr) Family {
	if a.Unmap().Is4() {
		return IPv4
	}
	return IPv6
}

var _ Rules = (*netfilter.Exec)(nil)
