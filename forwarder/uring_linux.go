package forwarder

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// uring is an io_uring instance used as a batch of system calls: a worker
// queues the reads (then the writes) of every connection one harvest found
// ready and submits them with one io_uring_enter. Every operation is on a
// non-blocking socket with MSG_DONTWAIT, so the kernel runs it inline
// during the submit and never arms a poll of its own: readiness stays
// epoll's, and every completion is posted before io_uring_enter returns.
// No Go io_uring library is served to this project (the module proxy
// refused giouring, iouring-go and go-uring), and the part used here is a
// submission ring, a completion ring and two opcodes.
type uring struct {
	fd int

	sqHead, sqTail *atomic.Uint32
	sqMask         uint32
	sqArray        []uint32
	sqes           []uringSQE

	cqHead, cqTail *atomic.Uint32
	cqMask         uint32
	cqes           []uringCQE

	queued uint32 // prepared since the last submit
	maps   [][]byte
}

// uringSQE is struct io_uring_sqe.
type uringSQE struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	off         uint64
	addr        uint64
	len         uint32
	opFlags     uint32
	userData    uint64
	bufIndex    uint16
	personality uint16
	spliceFdIn  int32
	addr3       uint64
	_           uint64
}

// uringCQE is struct io_uring_cqe.
type uringCQE struct {
	userData uint64
	res      int32
	flags    uint32
}

// uringParams is struct io_uring_params.
type uringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	_                                                                      [3]uint32
	sqOff                                                                  [10]uint32 // head, tail, ring_mask, ring_entries, flags, dropped, array, resv1, user_addr (2)
	cqOff                                                                  [10]uint32 // head, tail, ring_mask, ring_entries, overflow, cqes, flags, resv1, user_addr (2)
}

const (
	uringOpSend = 26 // IORING_OP_SEND
	uringOpRecv = 27 // IORING_OP_RECV

	uringSetupSubmitAll = 1 << 7 // IORING_SETUP_SUBMIT_ALL: one bad entry does not stop the rest
	uringEnterGetEvents = 1      // IORING_ENTER_GETEVENTS

	uringOffSQRing = 0
	uringOffCQRing = 0x8000000
	uringOffSQEs   = 0x10000000
)

// newUring sets up a ring of entries submissions (a power of two).
func newUring(entries uint32) (*uring, error) {
	var p uringParams
	p.flags = uringSetupSubmitAll
	fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if e == unix.EINVAL { // a kernel older than 5.18 has no SUBMIT_ALL
		p = uringParams{}
		fd, _, e = unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	}
	if e != 0 {
		return nil, fmt.Errorf("setting up io_uring: %w", e)
	}
	u := &uring{fd: int(fd)}
	unix.CloseOnExec(u.fd)
	mmap := func(off int64, size uint32) ([]byte, error) {
		b, err := unix.Mmap(u.fd, off, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			return nil, fmt.Errorf("mapping io_uring: %w", err)
		}
		u.maps = append(u.maps, b)
		return b, nil
	}
	sq, err := mmap(uringOffSQRing, p.sqOff[6]+p.sqEntries*4)
	if err != nil {
		u.close()
		return nil, err
	}
	cq, err := mmap(uringOffCQRing, p.cqOff[5]+p.cqEntries*uint32(unsafe.Sizeof(uringCQE{})))
	if err != nil {
		u.close()
		return nil, err
	}
	sqes, err := mmap(uringOffSQEs, p.sqEntries*uint32(unsafe.Sizeof(uringSQE{})))
	if err != nil {
		u.close()
		return nil, err
	}
	at := func(b []byte, off uint32) unsafe.Pointer { return unsafe.Pointer(&b[off]) }
	u.sqHead = (*atomic.Uint32)(at(sq, p.sqOff[0]))
	u.sqTail = (*atomic.Uint32)(at(sq, p.sqOff[1]))
	u.sqMask = *(*uint32)(at(sq, p.sqOff[2]))
	u.sqArray = unsafe.Slice((*uint32)(at(sq, p.sqOff[6])), p.sqEntries)
	u.sqes = unsafe.Slice((*uringSQE)(at(sqes, 0)), p.sqEntries)
	u.cqHead = (*atomic.Uint32)(at(cq, p.cqOff[0]))
	u.cqTail = (*atomic.Uint32)(at(cq, p.cqOff[1]))
	u.cqMask = *(*uint32)(at(cq, p.cqOff[2]))
	u.cqes = unsafe.Slice((*uringCQE)(at(cq, p.cqOff[5])), p.cqEntries)
	return u, nil
}

func (u *uring) close() {
	for _, b := range u.maps {
		_ = unix.Munmap(b)
	}
	u.maps = nil
	unix.Close(u.fd)
}

// queue prepares a send or receive of p on fd, tagged with tag. p must stay
// alive and in place until submit returns.
func (u *uring) queue(op uint8, fd int, p []byte, tag uint64) {
	tail := u.sqTail.Load() + u.queued
	i := tail & u.sqMask
	u.sqes[i] = uringSQE{opcode: op, fd: int32(fd), addr: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(p)))),
		len: uint32(len(p)), opFlags: unix.MSG_DONTWAIT | unix.MSG_NOSIGNAL, userData: tag}
	u.sqArray[i] = i
	u.queued++
}

var errUringShort = errors.New("io_uring completed fewer operations than submitted")

// submit runs what was queued and calls done with each result (bytes, or
// a negative errno). On an error some operations may not have run: they
// get no call, and the ring must be closed (they would run at its next
// use).
func (u *uring) submit(done func(tag uint64, res int32)) error {
	n := u.queued
	if n == 0 {
		return nil
	}
	u.sqTail.Add(n)
	u.queued = 0
	var err error
	for left := n; left > 0; {
		// The operations complete inline, so min_complete costs no wait;
		// it only makes the kernel flush its completions before returning.
		r, _, e := unix.RawSyscall6(unix.SYS_IO_URING_ENTER, uintptr(u.fd), uintptr(left), uintptr(left), uringEnterGetEvents, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			err = fmt.Errorf("submitting to io_uring: %w", e)
			break
		}
		if r == 0 {
			err = errUringShort
			break
		}
		left -= uint32(r)
	}
	head := u.cqHead.Load()
	tail := u.cqTail.Load()
	got := tail - head
	for ; head != tail; head++ {
		c := &u.cqes[head&u.cqMask]
		done(c.userData, c.res)
	}
	u.cqHead.Store(head)
	if err == nil && got < n {
		err = errUringShort
	}
	return err
}
