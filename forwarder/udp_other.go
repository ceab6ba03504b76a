//go:build !linux

package forwarder

import (
	"net"
	"syscall"
)

// replyBatch reads the datagrams a flow's backend has sent, one per read
// (there is no recvmmsg here), into a scratch buffer borrowed from
// datagramPool only once the socket is readable, kept in a buffer of its
// size (keepDatagram).
type replyBatch struct {
	fl    *udpFlow
	w     readWaiter
	bufs  [udpBatch]*[]byte
	sizes [udpBatch]int
}

func newReplyBatch(fl *udpFlow) *replyBatch {
	b := &replyBatch{fl: fl}
	b.w.init()
	return b
}

// read waits until the backend has sent something (or the flow's read
// deadline passes) and takes one datagram. The caller gives the buffers of
// bufs[:count] back with releaseDatagram.
func (b *replyBatch) read() (int, error) {
	if err := b.w.wait(b.fl.raw); err != nil {
		return 0, err
	}
	scratch := datagramPool.Get().(*[]byte)
	defer datagramPool.Put(scratch)
	n, err := b.fl.upstream.Read(*scratch)
	if err != nil {
		return 0, err
	}
	b.bufs[0], b.sizes[0] = keepDatagram(*scratch, n), n
	return 1, nil
}

// socketDrops is unknown here: there is no per-socket drop count to read.
func socketDrops(syscall.RawConn) (uint32, bool) { return 0, false }

// setReceiveBuffer sets pc's receive buffer (SO_RCVBUF) to n bytes.
func setReceiveBuffer(pc *net.UDPConn, n int) error { return pc.SetReadBuffer(n) }
