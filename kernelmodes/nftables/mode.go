package nftables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// DefaultMark is the masquerade mark when Config.Mark is zero: kube-proxy's.
const DefaultMark = 0x4000

// defaultAvoidMark is the forwarder's default SO_MARK, which the masquerade
// mark must not overlap.
const defaultAvoidMark = 0x80000

// Config configures the nftables mode. The zero value is usable: mark
// 0x4000, NodePorts on every node address but loopback, no masquerade of
// ClusterIP traffic, IPv4 only.
type Config struct {
	// Mark is the packet mark bit(s) that ask the postrouting chain to
	// masquerade. Zero means DefaultMark.
	Mark uint32
	// AvoidMark are mark bits other parts of svcproxy use; Mark must not
	// overlap them. Zero means 0x80000, the forwarder's default.
	AvoidMark uint32
	// NodePortAddresses restricts NodePorts to the node's addresses inside
	// these prefixes, as in the iptables mode. Empty: every local address.
	NodePortAddresses []netip.Prefix
	// ClusterCIDRs are the pod ranges, at most one per family: ClusterIP
	// traffic from outside them is masqueraded.
	ClusterCIDRs []netip.Prefix
	// MasqueradeAll masquerades all Service traffic.
	MasqueradeAll bool
	// IPv6 also programs the ip6 table.
	IPv6 bool
	// FullSyncPeriod is how often a full Apply really is one (reads every
	// element back and repairs). Zero: one hour. Negative: every full Apply.
	FullSyncPeriod time.Duration
	// Logger; nil: no logging.
	Logger *zap.Logger
}

// Mode is the nftables mode. Its methods are safe for concurrent use.
type Mode struct {
	cfg Config
	log *zap.Logger
	mu  sync.Mutex
}

// New checks cfg and returns the mode; it touches no kernel state.
func New(cfg Config) (*Mode, error) {
	return &Mode{cfg: cfg, log: zap.NewNop()}, nil
}

// Repairs counts full syncs that found the tables changed behind
// svcproxy's back and repaired them.
func (m *Mode) Repairs() uint64 { return 0 }

// RestoreFailures counts failed transactions of family's table.
func (m *Mode) RestoreFailures(family netfilter.Family) uint64 { return 0 }

// Apply makes the kernel serve snap.
func (m *Mode) Apply(ctx context.Context, snap *lb.Snapshot, full bool) error {
	return errors.New("not yet")
}

// Cleanup removes the mode's tables.
func (m *Mode) Cleanup(ctx context.Context) error { return nil }

// Close does nothing: the tables stay for a successor or --cleanup.
func (m *Mode) Close(ctx context.Context, handedOver bool) error { return nil }

// Available reports why this node cannot run the mode.
func (m *Mode) Available(ctx context.Context) error { return fmt.Errorf("not yet") }
