package forwarder

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// replyBatch reads the datagrams a flow's backend has sent: as many as are
// queued, up to udpBatch, each into a buffer borrowed from datagramPool
// only once it has arrived.
type replyBatch struct {
	raw   syscall.RawConn
	bufs  [udpBatch]*[]byte
	sizes [udpBatch]int
	count int
	err   error // the recvfrom error inside the callback
	fn    func(fd uintptr) bool
}

func newReplyBatch(fl *udpFlow) *replyBatch {
	b := &replyBatch{raw: fl.raw}
	b.fn = b.readFn
	return b
}

// read waits until the backend has sent something (or the flow's read
// deadline passes) and takes what is queued. The caller returns the
// buffers of bufs[:count] to datagramPool.
func (b *replyBatch) read() (int, error) {
	b.count, b.err = 0, nil
	err := b.raw.Read(b.fn)
	if err == nil {
		err = b.err
	}
	return b.count, err
}

func (b *replyBatch) readFn(fd uintptr) bool {
	for b.count < udpBatch {
		bp := datagramPool.Get().(*[]byte)
		n, _, err := unix.Recvfrom(int(fd), *bp, unix.MSG_DONTWAIT)
		if err == unix.EINTR {
			datagramPool.Put(bp)
			continue
		}
		if err != nil {
			datagramPool.Put(bp)
			if err != unix.EAGAIN {
				b.err = err
				return true
			}
			return b.count > 0 // wait only if nothing is in hand
		}
		b.bufs[b.count], b.sizes[b.count] = bp, n
		b.count++
	}
	return true
}
