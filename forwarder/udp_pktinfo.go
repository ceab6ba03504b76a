//go:build !windows

package forwarder

import (
	"fmt"
	"net"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/svcproxy/svcproxy/lb"
)

// newBatchConn wraps a frontend socket for batched reads and writes
// (recvmmsg and sendmmsg on Linux; one message a call elsewhere), with the
// destination of each datagram reported (IP_PKTINFO or its kin).
func newBatchConn(pc *net.UDPConn, k lb.Frontend, v6 bool) (batchConn, error) {
	var err error
	var bc batchConn
	if v6 {
		p := ipv6.NewPacketConn(pc)
		err = p.SetControlMessage(ipv6.FlagDst, true)
		bc = p
	} else {
		p := ipv4.NewPacketConn(pc)
		err = p.SetControlMessage(ipv4.FlagDst, true)
		bc = p
	}
	if err != nil {
		return nil, fmt.Errorf("enabling IP_PKTINFO on UDP socket for %v: %w", k, err)
	}
	return bc, nil
}
