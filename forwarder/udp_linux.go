package forwarder

import (
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// replyBatch reads the datagrams a flow's backend has sent: as many as are
// queued, up to udpBatch, each into a scratch buffer borrowed from
// datagramPool for the read, then kept in a buffer of its size
// (keepDatagram) once it has arrived.
type replyBatch struct {
	raw   syscall.RawConn
	bufs  [udpBatch]*[]byte
	sizes [udpBatch]int
	count int
	err   error // the recvfrom error inside the callback
	fn    func(fd uintptr) bool
	// probe: after a datagram, try for another before returning. On
	// when the last read found data without waiting (replies are
	// queueing: drain them in batches); off when it had to wait for one
	// (a query's answer), which saves the recvfrom that would say EAGAIN:
	// the next read tries anyway before it waits.
	probe bool
	calls int // of fn in this read: 1 means data was there at once
	// scratch is datagramPool's buffer for this read, borrowed when the
	// socket is first readable.
	scratch *[]byte
}

func newReplyBatch(fl *udpFlow) *replyBatch {
	b := &replyBatch{raw: fl.raw}
	b.fn = b.readFn
	return b
}

// read waits until the backend has sent something (or the flow's read
// deadline passes) and takes what is queued. The caller gives the buffers
// of bufs[:count] back with releaseDatagram.
func (b *replyBatch) read() (int, error) {
	b.count, b.err, b.calls = 0, nil, 0
	err := b.raw.Read(b.fn)
	if b.scratch != nil {
		datagramPool.Put(b.scratch)
		b.scratch = nil
	}
	if err == nil {
		err = b.err
	}
	b.probe = b.calls == 1
	return b.count, err
}

func (b *replyBatch) readFn(fd uintptr) bool {
	b.calls++
	for b.count < udpBatch {
		if b.scratch == nil {
			b.scratch = datagramPool.Get().(*[]byte)
		}
		n, _, err := unix.Recvfrom(int(fd), *b.scratch, unix.MSG_DONTWAIT)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			if err != unix.EAGAIN {
				b.err = err
				return true
			}
			if b.count == 0 { // wait, holding no buffer
				datagramPool.Put(b.scratch)
				b.scratch = nil
				return false
			}
			return true
		}
		b.bufs[b.count], b.sizes[b.count] = keepDatagram(*b.scratch, n), n
		b.count++
		if !b.probe && b.count == 1 {
			return true
		}
	}
	return true
}

// socketDrops returns how many datagrams the kernel has dropped at the
// socket for want of receive-buffer room (sk_drops, read with SO_MEMINFO:
// the count SO_RXQ_OVFL would attach to the next datagram, available
// without waiting for one).
func socketDrops(raw syscall.RawConn) (n uint32, ok bool) {
	if raw.Control(func(fd uintptr) { n, ok = fdDrops(int(fd)) }) != nil {
		return 0, false
	}
	return n, ok
}

// fdDrops is socketDrops for a raw descriptor.
func fdDrops(fd int) (uint32, bool) {
	const skMeminfoDrops = 8 // SK_MEMINFO_DROPS, linux/sock_diag.h (since 4.7)
	var info [skMeminfoDrops + 1]uint32
	l := uint32(unsafe.Sizeof(info))
	if err := getsockopt(fd, unix.SOL_SOCKET, unix.SO_MEMINFO, unsafe.Pointer(&info), &l); err != nil || l < uint32(unsafe.Sizeof(info)) {
		return 0, false
	}
	return info[skMeminfoDrops], true
}

// setReceiveBuffer sets pc's receive buffer to n bytes (fdReceiveBuffer).
func setReceiveBuffer(pc *net.UDPConn, n int) error {
	raw, err := pc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = fdReceiveBuffer(int(fd), n) }); err != nil {
		return err
	}
	return serr
}

// fdReceiveBuffer sets fd's receive buffer to n bytes: SO_RCVBUFFORCE,
// which may exceed net.core.rmem_max (CAP_NET_ADMIN), else SO_RCVBUF,
// which the kernel caps there.
func fdReceiveBuffer(fd, n int) error {
	if sysSetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, n) == nil {
		return nil
	}
	return sysSetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, n)
}
