package main

import (
	"fmt"
	"net/netip"
	"strconv"

	"github.com/svcproxy/svcproxy/internal/vmtest"
)

// The addresses of the topology (198.18.0.0/15, nothing else exists in the
// VM): the node is the VM's initial namespace, the client pod and the
// backends each a namespace of their own behind a veth, /32 addresses on
// both ends and the node as every other host's gateway (the CNI ptp shape).
var (
	nodeIP     = netip.MustParseAddr("198.18.0.1")
	podIP      = netip.MustParseAddr("198.18.1.1")
	backendIPs = []netip.Addr{
		netip.MustParseAddr("198.18.2.1"),
		netip.MustParseAddr("198.18.2.2"),
		netip.MustParseAddr("198.18.2.3"),
	}
	// serviceVIP is the data-path Service's ClusterIP and port; the
	// backends serve HTTP on backendPort.
	serviceVIP         = netip.MustParseAddrPort("198.19.0.10:80")
	backendPort uint16 = 8080
)

// topology is a client pod and the backends around the node. Each (round,
// mode) of the data path gets a fresh one, so no mode inherits another's
// TIME_WAIT sockets in the pod or the backends.
type topology struct {
	pod      vmtest.GuestHost
	backends []vmtest.GuestHost
	servers  []*server
}

// newTopology builds the pod and backend namespaces and starts the
// backends' HTTP servers.
func newTopology() (*topology, error) {
	t := &topology{}
	var err error
	if t.pod, err = vmtest.AddGuestHost("pod", podIP, nodeIP); err != nil {
		t.close()
		return nil, err
	}
	for i, ip := range backendIPs {
		b, err := vmtest.AddGuestHost("b"+strconv.Itoa(i), ip, nodeIP)
		if err != nil {
			t.close()
			return nil, err
		}
		t.backends = append(t.backends, b)
		s, err := startServer(b, backendPort)
		if err != nil {
			t.close()
			return nil, fmt.Errorf("starting %s's server: %w", b.Name, err)
		}
		t.servers = append(t.servers, s)
	}
	return t, nil
}

// close stops the servers and removes the veths; the namespaces go with
// their last reference.
func (t *topology) close() {
	for _, s := range t.servers {
		s.close()
	}
	for _, h := range append([]vmtest.GuestHost{t.pod}, t.backends...) {
		h.Close()
	}
}
