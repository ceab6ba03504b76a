package forwarder

import (
	"errors"
	"fmt"
	"net"

	"golang.org/x/net/ipv4"

	"github.com/svcproxy/svcproxy/lb"
)

// newBatchConn wraps a frontend socket for one datagram per call: x/net's
// batch and control-message calls are not implemented for Windows, so
// the destination a client wrote to is not known. A frontend bound to one
// address replies from it anyway; one on the unspecified address (a
// NodePort) could reply from the wrong one, and is refused.
func newBatchConn(pc *net.UDPConn, k lb.Frontend, _ bool) (batchConn, error) {
	if k.Addr.Addr().IsUnspecified() {
		return nil, fmt.Errorf("opening UDP frontend %v: replies from the address the client wrote to need IP_PKTINFO: %w on windows", k, errors.ErrUnsupported)
	}
	return singleConn{pc}, nil
}

// singleConn is a batchConn that moves one datagram per call.
type singleConn struct{ c *net.UDPConn }

func (s singleConn) ReadBatch(ms []ipv4.Message, _ int) (int, error) {
	m := &ms[0]
	n, addr, err := s.c.ReadFromUDP(m.Buffers[0])
	if err != nil {
		return 0, err
	}
	m.N, m.NN, m.Addr = n, 0, addr
	return 1, nil
}

func (s singleConn) WriteBatch(ms []ipv4.Message, _ int) (int, error) {
	for i := range ms {
		if _, err := s.c.WriteTo(ms[i].Buffers[0], ms[i].Addr); err != nil {
			return i, err
		}
	}
	return len(ms), nil
}
