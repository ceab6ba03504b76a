package nftables

import (
	"strconv"
	"strings"

	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/nftable"
)

// Slots is how many endpoints a frontend spreads over at most. A frontend
// with n endpoints has min(n, Slots) elements in the endpoints map, slot i
// holding endpoint i, and an element in the slots map that sends a new
// connection to the chain `numgen random mod min(n, Slots)` runs in: each
// endpoint gets exactly its share. At 10,000 Services × 10 endpoints that
// is 110,000 elements, where 64 slots a frontend took 640,000.
const Slots = 64

// SlotsChain is the chain that picks one of m slots of a frontend's
// endpoints (1 <= m <= Slots); NodePortSlotsChain the same for a NodePort.
func SlotsChain(m int) string { return "slots-" + strconv.Itoa(m) }

// NodePortSlotsChain: see SlotsChain.
func NodePortSlotsChain(m int) string { return "nodeport-slots-" + strconv.Itoa(m) }

// ShortSlotsChain is the chain that picks one of m slots of a frontend's
// short circuit (lb.Balancer.ShortCircuit: pods and the node reaching an
// external frontend of a Service with externalTrafficPolicy Local get the
// Cluster policy's endpoints); NodePortShortSlotsChain the same for a
// NodePort. Those slots are ShortSlot and up in the endpoints maps.
func ShortSlotsChain(m int) string { return "short-circuit-slots-" + strconv.Itoa(m) }

// NodePortShortSlotsChain: see ShortSlotsChain.
func NodePortShortSlotsChain(m int) string { return "nodeport-short-circuit-slots-" + strconv.Itoa(m) }

// ShortSlot is the first slot of a short circuit's endpoints in the
// endpoints maps (numgen's offset): a frontend's own are 0 to Slots-1.
const ShortSlot = 1 << 16

// SlotsOf is the m of a SlotsChain, NodePortSlotsChain, ShortSlotsChain or
// NodePortShortSlotsChain name (0 if it is none).
func SlotsOf(chain string) int {
	s, ok := strings.CutPrefix(strings.TrimPrefix(strings.TrimPrefix(chain, "nodeport-"), "short-circuit-"), "slots-")
	if !ok {
		return 0
	}
	if m, err := strconv.Atoi(s); err == nil && m >= 1 && m <= Slots {
		return m
	}
	return 0
}

// The sets and maps of each family's table. Keys and values are
// concatenations whose fields the kernel pads to 4 bytes each; addresses
// and ports are in network order, a slot in host order (numgen's).
const (
	// SetServiceSlots maps a frontend (address . protocol . port) to the
	// SlotsChain of its number of endpoints: ClusterIPs, ExternalIPs,
	// LoadBalancer IPs.
	SetServiceSlots = "service-slots"
	// SetNodePortSlots maps protocol . NodePort to its NodePortSlotsChain.
	SetNodePortSlots = "nodeport-slots"
	// SetServiceEndpoints maps frontend address . protocol . port . slot to
	// endpoint address . port.
	SetServiceEndpoints = "service-endpoints"
	// SetNodePortEndpoints maps protocol . NodePort . slot to endpoint
	// address . port, on the node's NodePort addresses.
	SetNodePortEndpoints = "nodeport-endpoints"
	// SetNoEndpoints holds frontends (address . protocol . port) that have
	// no endpoints of the family: rejected.
	SetNoEndpoints = "no-endpoints"
	// SetNodePortNoEndpoints holds protocol . NodePort of NodePorts without
	// endpoints of the family: rejected.
	SetNodePortNoEndpoints = "nodeport-no-endpoints"
	// SetMasquerade holds frontends whose traffic is always masqueraded
	// (external frontends with the Cluster policy; ClusterIP frontends with
	// MasqueradeAll).
	SetMasquerade = "masquerade-frontends"
	// SetMasqueradeOffCluster holds ClusterIP frontends whose traffic is
	// masqueraded when it comes from outside the family's cluster CIDR.
	SetMasqueradeOffCluster = "masquerade-off-cluster"
	// SetNodePortMasquerade holds protocol . NodePort of NodePorts whose
	// traffic is masqueraded (Cluster policy).
	SetNodePortMasquerade = "nodeport-masquerade"
	// SetHairpin holds endpoint address . endpoint address: a connection
	// DNATed to its own source is masqueraded, so the reply comes back
	// through the node.
	SetHairpin = "hairpin"
	// SetShortCircuitSlots maps an external frontend of a Service with
	// externalTrafficPolicy Local to the ShortSlotsChain of its short
	// circuit's number of endpoints: where pods (sources within the
	// cluster CIDR) and the node go. SetNodePortShortCircuitSlots: the same
	// for protocol . NodePort.
	SetShortCircuitSlots         = "short-circuit-slots"
	SetNodePortShortCircuitSlots = "nodeport-short-circuit-slots"
	// SetShortCircuit holds the frontends of SetShortCircuitSlots, and
	// SetNodePortShortCircuit the NodePorts of its NodePort twin: the
	// node's own connections to them are masqueraded (the address may be
	// its own, and the endpoint would answer it there).
	SetShortCircuit         = "short-circuit"
	SetNodePortShortCircuit = "nodeport-short-circuit"
)

// SetAffinity is the dynamic map of session affinity: client address .
// frontend address . protocol . port → the endpoint address . port the
// client's last connection went to, each element with its Service's
// timeout. The kernel fills it (in nat postrouting); the mode only deletes
// elements whose endpoint left. It is not one of Sets: it is never
// compared or repaired.
const SetAffinity = "affinity"

// AffinitySet holds the frontends (address . protocol . port) of Services
// with session affinity of the given timeout (seconds);
// AffinityNodePortSet their NodePorts (protocol . port). A table has a pair
// per timeout its Services use (Layout.AffinityTimeouts).
func AffinitySet(seconds uint32) string { return "affinity-" + strconv.FormatUint(uint64(seconds), 10) }

// AffinityNodePortSet: see AffinitySet.
func AffinityNodePortSet(seconds uint32) string {
	return "affinity-nodeports-" + strconv.FormatUint(uint64(seconds), 10)
}

// Sets is every set and map of a table, in the order they are created.
var Sets = []string{SetServiceSlots, SetNodePortSlots, SetServiceEndpoints, SetNodePortEndpoints, SetNoEndpoints, SetNodePortNoEndpoints,
	SetMasquerade, SetMasqueradeOffCluster, SetNodePortMasquerade, SetHairpin,
	SetShortCircuitSlots, SetNodePortShortCircuitSlots, SetShortCircuit, SetNodePortShortCircuit}

// IsMap reports whether set is a map (its elements have values).
func IsMap(set string) bool {
	return set == SetServiceEndpoints || set == SetNodePortEndpoints || set == SetAffinity ||
		set == SetServiceSlots || set == SetNodePortSlots || set == SetShortCircuitSlots || set == SetNodePortShortCircuitSlots
}

// Elements are a set's elements as the kernel holds them: encoded key →
// encoded value ("" in a set that is not a map).
type Elements map[string]string

// Tables is what one family's table holds: its sets' elements by set name.
type Tables map[string]Elements

func newTables() Tables {
	t := make(Tables, len(Sets))
	for _, s := range Sets {
		t[s] = Elements{}
	}
	return t
}

// KeyLen is the length of a key of set in fam.
func KeyLen(fam netfilter.Family, set string) int {
	n := nftable.AddrLen(fam)
	switch set {
	case SetServiceEndpoints:
		return n + 12
	case SetNoEndpoints, SetMasquerade, SetMasqueradeOffCluster, SetServiceSlots, SetShortCircuitSlots, SetShortCircuit:
		return n + 8
	case SetNodePortEndpoints:
		return 12
	case SetNodePortNoEndpoints, SetNodePortMasquerade, SetNodePortSlots, SetNodePortShortCircuitSlots, SetNodePortShortCircuit:
		return 8
	case SetHairpin:
		return 2 * n
	case SetAffinity:
		return 2*n + 8
	}
	switch {
	case strings.HasPrefix(set, "affinity-nodeports-"):
		return 8
	case strings.HasPrefix(set, "affinity-"):
		return n + 8
	}
	return 0
}
