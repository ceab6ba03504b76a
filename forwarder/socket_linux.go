package forwarder

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Raw sockets for the event loop: created, optioned and connected with
// golang.org/x/sys/unix, never registered with Go's poller.

// listenSocket opens a non-blocking listening TCP socket on addr with
// SO_REUSEPORT. An unspecified IPv6 address is dual-stack unless v6only. The
// options accepted connections share are set here once, because Linux
// copies them from the listener to every connection it accepts:
// TCP_NODELAY and the keepalive settings (keepalive < 0: off).
func listenSocket(addr netip.AddrPort, v6only bool, keepalive time.Duration) (int, error) {
	fd, err := bindSocket(addr, v6only, keepalive)
	if err != nil {
		return -1, err
	}
	if err := unix.Listen(fd, listenBacklog()); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("listening: %w", err)
	}
	return fd, nil
}

// bindSocket is listenSocket up to the listen: a socket bound with
// SO_REUSEPORT does not join its port's group, and takes no connection,
// until it listens.
func bindSocket(addr netip.AddrPort, v6only bool, keepalive time.Duration) (int, error) {
	fd, err := newSocket(addr.Addr(), unix.SOCK_STREAM, 0)
	if err != nil {
		return -1, fmt.Errorf("creating socket: %w", err)
	}
	opts := []sockopt{
		{unix.SOL_SOCKET, unix.SO_REUSEADDR, 1, "SO_REUSEADDR"},
		{unix.SOL_SOCKET, unix.SO_REUSEPORT, 1, "SO_REUSEPORT"},
		{unix.IPPROTO_TCP, unix.TCP_NODELAY, 1, "TCP_NODELAY"},
	}
	switch {
	case v6only:
		opts = append(opts, sockopt{unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1, "IPV6_V6ONLY"})
	case addr.Addr().Is6() && addr.Addr().IsUnspecified():
		opts = append(opts, sockopt{unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0, "IPV6_V6ONLY"}) // dual-stack, as Go's "tcp"
	}
	opts = append(opts, keepaliveOpts(keepalive, true)...)
	if err := setsockopts(fd, opts); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if err := unix.Bind(fd, sockaddr(addr)); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("binding: %w", err)
	}
	return fd, nil
}

// adoptSocket takes a listening socket handed over by a predecessor as a
// non-blocking descriptor of the forwarder's own; the caller closes file.
func adoptSocket(file *os.File) (int, error) {
	rc, err := file.SyscallConn() // Fd() would make the shared description blocking
	if err != nil {
		return -1, err
	}
	return dupNonblock(rc)
}

// dupNonblock duplicates the socket behind rc as a non-blocking descriptor
// of the caller's own.
func dupNonblock(rc syscall.RawConn) (int, error) {
	fd := -1
	var err error
	if cerr := rc.Control(func(s uintptr) { fd, err = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); cerr != nil {
		return -1, cerr
	}
	if err != nil {
		return -1, fmt.Errorf("duplicating socket: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("making socket non-blocking: %w", err)
	}
	return fd, nil
}

type sockopt struct {
	level, name, value int
	what               string
}

func setsockopts(fd int, opts []sockopt) error {
	for _, o := range opts {
		if err := unix.SetsockoptInt(fd, o.level, o.name, o.value); err != nil {
			return fmt.Errorf("setting %s: %w", o.what, err)
		}
	}
	return nil
}

// keepaliveOpts are the options for TCP keepalive after d idle, probing
// every d (d < 0: off). The probe count is set on listeners (once, for every
// accepted connection); upstream sockets keep the kernel's
// tcp_keepalive_probes (9 unless the node changed it), one setsockopt less
// per connection.
func keepaliveOpts(d time.Duration, withCount bool) []sockopt {
	if d < 0 {
		return []sockopt{{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 0, "SO_KEEPALIVE"}}
	}
	secs := max(int(d/time.Second), 1)
	opts := []sockopt{
		{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1, "SO_KEEPALIVE"},
		{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, secs, "TCP_KEEPIDLE"},
		{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, secs, "TCP_KEEPINTVL"},
	}
	if withCount {
		opts = append(opts, sockopt{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, 9, "TCP_KEEPCNT"})
	}
	return opts
}

var backlog = sync.OnceValue(func() int {
	// As Go's net package: the kernel's somaxconn, capped where the
	// kernel's listen(2) would truncate it.
	n := unix.SOMAXCONN
	if b, err := os.ReadFile("/proc/sys/net/core/somaxconn"); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && v > 0 {
			n = min(v, 1<<16-1)
		}
	}
	return n
})

func listenBacklog() int { return backlog() }

func sockaddr(a netip.AddrPort) unix.Sockaddr {
	if a.Addr().Is4() {
		return &unix.SockaddrInet4{Port: int(a.Port()), Addr: a.Addr().As4()}
	}
	return &unix.SockaddrInet6{Port: int(a.Port()), Addr: a.Addr().As16()}
}

// sockName is fd's local address, IPv4-mapped addresses unmapped.
func sockName(fd int) (netip.AddrPort, error) {
	var rsa unix.RawSockaddrAny
	l := uint32(unix.SizeofSockaddrAny)
	if _, _, e := unix.RawSyscall(unix.SYS_GETSOCKNAME, uintptr(fd), uintptr(unsafe.Pointer(&rsa)), uintptr(unsafe.Pointer(&l))); e != 0 {
		return netip.AddrPort{}, e
	}
	return rawAddrPort(&rsa), nil
}

// rawAddrPort decodes an IPv4 or IPv6 socket address, unmapping
// IPv4-mapped IPv6 addresses; anything else is the zero AddrPort.
func rawAddrPort(rsa *unix.RawSockaddrAny) netip.AddrPort {
	switch rsa.Addr.Family {
	case unix.AF_INET:
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(rsa))
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), portOf(&sa.Port))
	case unix.AF_INET6:
		sa := (*unix.RawSockaddrInet6)(unsafe.Pointer(rsa))
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), portOf(&sa.Port))
	}
	return netip.AddrPort{}
}

// portOf reads a port in network byte order.
func portOf(p *uint16) uint16 { return binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(p))[:]) }

func setPort(p *uint16, port uint16) {
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(p))[:], port)
}

// connectSocket starts a non-blocking connect to a from a new socket with
// SO_MARK (mark > 0) and TCP_NODELAY (keepalive comes later, see
// relay.keepalive), and with holdACK the handshake's last ACK held back for
// the first bytes written. A nil error means the connect is under way (or
// done); its outcome arrives as EPOLLOUT or EPOLLERR. sa4 and sa6 are
// scratch space.
func connectSocket(a netip.AddrPort, mark int, holdACK bool, sa4 *unix.RawSockaddrInet4, sa6 *unix.RawSockaddrInet6) (int, error) {
	fd, err := newSocket(a.Addr(), unix.SOCK_STREAM, mark)
	if err != nil {
		return -1, err
	}
	if err := sysSetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		sysClose(fd)
		return -1, err
	}
	if holdACK {
		// Delayed-ACK mode: the SYN-ACK's ACK waits for the first bytes
		// written (the kernel leaves the mode once connected). A saving
		// only: refused, the dial goes on as an ordinary one.
		_ = sysSetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_QUICKACK, 0)
	}
	var p unsafe.Pointer
	var l uintptr
	if a.Addr().Is4() {
		sa4.Family = unix.AF_INET
		sa4.Addr = a.Addr().As4()
		setPort(&sa4.Port, a.Port())
		p, l = unsafe.Pointer(sa4), unix.SizeofSockaddrInet4
	} else {
		sa6.Family = unix.AF_INET6
		sa6.Addr = a.Addr().As16()
		setPort(&sa6.Port, a.Port())
		p, l = unsafe.Pointer(sa6), unix.SizeofSockaddrInet6
	}
	for {
		_, _, e := unix.RawSyscall(unix.SYS_CONNECT, uintptr(fd), uintptr(p), l)
		switch e {
		case 0, unix.EINPROGRESS:
			return fd, nil
		case unix.EINTR:
			continue
		}
		sysClose(fd)
		return -1, e
	}
}

// newSocket opens a non-blocking socket of typ (SOCK_STREAM, SOCK_DGRAM)
// in a's family, with SO_MARK when mark > 0. Errors are the bare errno:
// a dial's lands in the connection log as it is.
func newSocket(a netip.Addr, typ, mark int) (int, error) {
	family := unix.AF_INET
	if a.Is6() {
		family = unix.AF_INET6
	}
	r, _, e := unix.RawSyscall(unix.SYS_SOCKET, uintptr(family), uintptr(typ|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC), 0)
	if e != 0 {
		return -1, e
	}
	fd := int(r)
	if mark > 0 {
		if err := sysSetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, mark); err != nil {
			sysClose(fd)
			return -1, err
		}
	}
	return fd, nil
}

// soError reads and clears fd's pending error.
func soError(fd int) error {
	var v int32
	l := uint32(unsafe.Sizeof(v))
	if err := getsockopt(fd, unix.SOL_SOCKET, unix.SO_ERROR, unsafe.Pointer(&v), &l); err != nil {
		return err
	}
	if v == 0 {
		return nil
	}
	return unix.Errno(v)
}

// peerGone reports whether a socket that signalled a hang-up or error has
// nothing left to read: its peer left rather than sending and then
// half-closing.
func peerGone(fd int) bool {
	var b [1]byte
	n, _, err := unix.Recvfrom(fd, b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	if err == unix.EAGAIN || err == unix.EINTR {
		return false
	}
	return n == 0 || err != nil
}

// System calls of the event loop's hot path, made raw: every one of them is
// on a non-blocking descriptor (or an epoll_wait with a zero timeout) and
// returns at once, so there is nothing to gain from telling the scheduler
// (entersyscall/exitsyscall), and much to lose: a P seen in a system call
// is handed to another thread by sysmon, which itself then polls every
// 20 µs instead of backing off (the nanosleep and futex calls of the first
// bench's strace profile). A call needs only to be descheduled at its
// return (the kernel preempts there when the call woke a client or a
// backend on a busy CPU) to look long to sysmon. The per-connection calls
// were the last ones left through the scheduler (socket, the SO_ERROR
// read, epoll_ctl of every socket and of the parking epoll, the
// eventfd): made raw too (2026-11-28, bench connrate test, svcproxy-vip
// against the same binary before, 4 rounds, medians), sysmon's nanosleeps
// fell from 1,706 to 3 a second and the CPU per 10,000 connections from
// 0.434 s to 0.404 s (nginx stream in the same runs: 0.417 s);
// keep-alive, where they are rare, unchanged.

func sysRead(fd int, p []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

func sysWrite(fd int, p []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// sysWriteLast writes p, the last bytes before a FIN that follows at once,
// with MSG_MORE: the kernel holds the tail it would have sent on its own,
// and the shutdown or close that follows sends it with the FIN in one
// segment. Nothing waits on it: with bytes still in flight, the ACKs that
// come back push the tail as they would any other.
func sysWriteLast(fd int, p []byte) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)), unix.MSG_MORE, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// clientSpoke reports whether the client on fd has sent bytes, leaving
// them in its socket (a one-byte MSG_PEEK into buf). Nothing, an end or
// an error says no; the events report those.
func clientSpoke(fd int, buf []byte) bool {
	n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(buf))), 1, unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	return e == 0 && n > 0
}

// ackNow sends the ACK the kernel holds back for fd, if any, at once
// (TCP_QUICKACK: the mode lasts a few segments, the flush is what counts).
// A socket read by splice whose queue held more than it took does not ACK
// at the read; when the sender then waits on that ACK (its window or
// congestion window full, as at the end of every response), it comes
// from the delayed-ACK timer, 20–40 ms later.
func ackNow(fd int) { _ = sysSetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_QUICKACK, 1) }

func sysSplice(in, out, n int) (int, error) {
	m, _, e := unix.RawSyscall6(unix.SYS_SPLICE, uintptr(in), 0, uintptr(out), 0, uintptr(n), unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
	if e != 0 {
		return 0, e
	}
	return int(m), nil
}

// sysEpollPoll harvests ready events without waiting.
func sysEpollPoll(ep int, events []unix.EpollEvent) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(unsafe.SliceData(events))), uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// sysEpollCtl adds, changes or removes fd in ep (ev nil for a removal).
func sysEpollCtl(ep, op, fd int, ev *unix.EpollEvent) error {
	if _, _, e := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(ep), uintptr(op), uintptr(fd), uintptr(unsafe.Pointer(ev)), 0, 0); e != 0 {
		return e
	}
	return nil
}

func sysClose(fd int) { unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0) }

func sysShutdownWrite(fd int) { unix.RawSyscall(unix.SYS_SHUTDOWN, uintptr(fd), unix.SHUT_WR, 0) }

func sysSetsockoptInt(fd, level, name, v int) error {
	val := int32(v)
	_, _, e := unix.RawSyscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(name), uintptr(unsafe.Pointer(&val)), 4, 0)
	if e != 0 {
		return e
	}
	return nil
}
