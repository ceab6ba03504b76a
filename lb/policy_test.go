package lb

import (
	"net/netip"
	"slices"
	"testing"
)

// Endpoint conditions, as the EndpointSlice controller sets them.
const (
	ready          = iota // ready, serving, not terminating
	servingTerm           // not ready, serving, terminating: a draining pod
	terminating           // not ready, not serving, terminating: a dead draining pod
	notReady              // not ready, not serving, not terminating: a starting pod
	servingNotTerm        // not ready, serving, not terminating: never used as fallback
)

// ep is an endpoint at 10.0.0.<last>:80 on node, in condition cond, with
// topology hints.
func ep(last byte, node string, cond int, hints ...string) Endpoint {
	e := Endpoint{
		Addr:      netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, last}), 80),
		NodeName:  node,
		ZoneHints: hints,
	}
	switch cond {
	case ready:
		e.Ready, e.Serving = true, true
	case servingTerm:
		e.Serving, e.Terminating = true, true
	case terminating:
		e.Terminating = true
	case servingNotTerm:
		e.Serving = true
	}
	return e
}

// at names the endpoints 10.0.0.<last>:80 as UsableEndpoints returns them.
func at(lasts ...byte) []string {
	out := []string{}
	for _, l := range lasts {
		out = append(out, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, l}), 80).String())
	}
	return out
}

func TestUsableEndpoints(t *testing.T) {
	node := Node{Name: "n1", Zone: "z1"}
	for _, tc := range []struct {
		name     string
		itp, etp TrafficPolicy
		node     Node
		eps      []Endpoint
		internal []string
		external []string
		short    []string // the short circuit's, with an external policy of Local
	}{
		{
			name: "cluster/ready only",
			node: node,
			eps:  []Endpoint{ep(1, "n1", ready), ep(2, "n2", notReady), ep(3, "n2", servingTerm), ep(4, "n1", ready), ep(5, "n1", servingNotTerm)},
			// A ready endpoint exists, so draining ones get no new traffic.
			internal: at(1, 4),
			external: at(1, 4),
		},
		{
			name:     "cluster/no ready falls back to serving and terminating",
			node:     node,
			eps:      []Endpoint{ep(1, "n1", servingTerm), ep(2, "n2", terminating), ep(3, "n2", notReady), ep(4, "n2", servingTerm), ep(5, "n2", servingNotTerm)},
			internal: at(1, 4),
			external: at(1, 4),
		},
		{
			name:     "cluster/nothing usable",
			node:     node,
			eps:      []Endpoint{ep(1, "n1", terminating), ep(2, "n2", notReady)},
			internal: at(),
			external: at(),
		},
		{
			name:     "cluster/no endpoints",
			node:     node,
			internal: at(),
			external: at(),
		},
		{
			name:     "internal local/only this node's endpoints",
			itp:      PolicyLocal,
			node:     node,
			eps:      []Endpoint{ep(1, "n1", ready), ep(2, "n2", ready), ep(3, "n1", ready), ep(4, "", ready)},
			internal: at(1, 3),
			external: at(1, 2, 3, 4),
		},
		{
			name: "internal local/falls back to local terminating, not to remote ready",
			itp:  PolicyLocal,
			node: node,
			eps:  []Endpoint{ep(1, "n1", servingTerm), ep(2, "n2", ready), ep(3, "n1", terminating)},
			// Local fallback is this node's serving+terminating endpoint;
			// Cluster (external) still has a ready one and ignores draining.
			internal: at(1),
			external: at(2),
		},
		{
			name:     "internal local/no local endpoints is empty, never remote",
			itp:      PolicyLocal,
			node:     node,
			eps:      []Endpoint{ep(1, "n2", ready), ep(2, "n3", servingTerm)},
			internal: at(),
			external: at(1),
		},
		{
			name:     "internal local/local not-serving terminating excluded",
			itp:      PolicyLocal,
			node:     node,
			eps:      []Endpoint{ep(1, "n1", terminating), ep(2, "n1", notReady), ep(3, "n2", ready)},
			internal: at(),
			external: at(3),
		},
		{
			name:     "internal local/local ready preferred over local terminating",
			itp:      PolicyLocal,
			node:     node,
			eps:      []Endpoint{ep(1, "n1", servingTerm), ep(2, "n1", ready)},
			internal: at(2),
			external: at(2),
		},
		{
			name:     "external local/only this node's endpoints",
			etp:      PolicyLocal,
			node:     node,
			eps:      []Endpoint{ep(1, "n1", ready), ep(2, "n2", ready)},
			internal: at(1, 2),
			external: at(1),
			short:    at(1, 2),
		},
		{
			name:     "external local/falls back to local terminating",
			etp:      PolicyLocal,
			node:     node,
			eps:      []Endpoint{ep(1, "n1", servingTerm), ep(2, "n2", ready), ep(3, "n1", terminating)},
			internal: at(2),
			external: at(1),
			short:    at(2),
		},
		{
			name:     "external local/no local endpoints is empty",
			etp:      PolicyLocal,
			node:     node,
			eps:      []Endpoint{ep(1, "n2", ready)},
			internal: at(1),
			external: at(),
			short:    at(1),
		},
		{
			name:     "both local",
			itp:      PolicyLocal,
			etp:      PolicyLocal,
			node:     node,
			eps:      []Endpoint{ep(1, "n1", ready), ep(2, "n2", ready), ep(3, "n1", servingTerm)},
			internal: at(1),
			external: at(1),
			short:    at(1, 2),
		},
		{
			name:     "both local/fallback",
			itp:      PolicyLocal,
			etp:      PolicyLocal,
			node:     node,
			eps:      []Endpoint{ep(1, "n1", servingTerm), ep(2, "n2", ready)},
			internal: at(1),
			external: at(1),
			short:    at(2),
		},
		{
			name:     "local/unnamed node matches no endpoint, not even unnamed ones",
			itp:      PolicyLocal,
			etp:      PolicyLocal,
			node:     Node{},
			eps:      []Endpoint{ep(1, "", ready), ep(2, "n2", ready)},
			internal: at(),
			external: at(),
			short:    at(1, 2),
		},
		{
			name:     "topology/all hinted, some for this zone",
			node:     node,
			eps:      []Endpoint{ep(1, "n1", ready, "z1"), ep(2, "n2", ready, "z2"), ep(3, "n3", ready, "z2", "z1"), ep(4, "n4", ready, "z3")},
			internal: at(1, 3),
			external: at(1, 3),
		},
		{
			name:     "topology/one ready endpoint without hints disables",
			node:     node,
			eps:      []Endpoint{ep(1, "n1", ready, "z1"), ep(2, "n2", ready, "z2"), ep(3, "n3", ready)},
			internal: at(1, 2, 3),
			external: at(1, 2, 3),
		},
		{
			name:     "topology/no hint for this zone disables",
			node:     node,
			eps:      []Endpoint{ep(1, "n1", ready, "z2"), ep(2, "n2", ready, "z3")},
			internal: at(1, 2),
			external: at(1, 2),
		},
		{
			name:     "topology/node without zone disables",
			node:     Node{Name: "n1"},
			eps:      []Endpoint{ep(1, "n1", ready, "z1"), ep(2, "n2", ready, "z2")},
			internal: at(1, 2),
			external: at(1, 2),
		},
		{
			name: "topology/only usable endpoints' hints count",
			node: node,
			// 10.0.0.2 has no hints but is not ready, so it does not
			// disable topology for the ready ones.
			eps:      []Endpoint{ep(1, "n1", ready, "z1"), ep(2, "n2", notReady), ep(3, "n3", ready, "z2")},
			internal: at(1),
			external: at(1),
		},
		{
			name: "topology/not applied to the serving-terminating fallback",
			node: node,
			// No endpoint is ready: every serving one is used, as
			// kube-proxy does, whatever its hints.
			eps:      []Endpoint{ep(1, "n1", servingTerm, "z1"), ep(2, "n2", servingTerm, "z2")},
			internal: at(1, 2),
			external: at(1, 2),
		},
		{
			name: "topology/not applied to a Local policy",
			etp:  PolicyLocal,
			node: node,
			// Internal (Cluster) is narrowed to zone z1; external (Local)
			// keeps this node's endpoint although it is hinted elsewhere.
			eps:      []Endpoint{ep(1, "n1", ready, "z2"), ep(2, "n2", ready, "z1")},
			internal: at(2),
			external: at(1),
			short:    at(2),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &Service{InternalTrafficPolicy: tc.itp, ExternalTrafficPolicy: tc.etp, Endpoints: tc.eps}
			internal, external, short := UsableEndpoints(svc, tc.node)
			if got := epAddrs(internal); !slices.Equal(got, tc.internal) {
				t.Errorf("internal = %v, want %v", got, tc.internal)
			}
			if got := epAddrs(external); !slices.Equal(got, tc.external) {
				t.Errorf("external = %v, want %v", got, tc.external)
			}
			switch {
			case tc.etp == PolicyCluster && short != nil:
				t.Errorf("short circuit = %v with an external policy of Cluster, want none", epAddrs(short))
			case tc.etp == PolicyLocal && !slices.Equal(epAddrs(short), tc.short):
				t.Errorf("short circuit = %v, want %v", epAddrs(short), tc.short)
			}
		})
	}
}

// TestUsableEndpointsCopies checks the result is the caller's to keep: it
// does not alias the Service's endpoints.
func TestUsableEndpointsCopies(t *testing.T) {
	svc := &Service{Endpoints: []Endpoint{ep(1, "n1", ready, "z1"), ep(2, "n2", ready, "z1")}}
	for _, node := range []Node{{Name: "n1"}, {Name: "n1", Zone: "z1"}} {
		internal, _, _ := UsableEndpoints(svc, node)
		if len(internal) != 2 {
			t.Fatalf("node %+v: internal = %v, want 2 endpoints", node, epAddrs(internal))
		}
		internal[0].Ready = false
		internal[0].Addr = netip.AddrPort{}
		if got := svc.Endpoints[0]; !got.Ready || got.Addr != ep(1, "", ready).Addr {
			t.Errorf("node %+v: modifying the result changed svc.Endpoints[0] to %+v", node, got)
		}
	}
}
