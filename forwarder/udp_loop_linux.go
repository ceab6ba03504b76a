package forwarder

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/connlog"
	"github.com/svcproxy/svcproxy/lb"
)

// UDP on the event loop
//
// With the event loop, a UDP frontend's socket and its flows' backend
// sockets belong to one worker (frontends are spread over the workers in
// turn), in its epoll, edge-triggered: no goroutine per frontend or per
// flow, no lock on the data path, and no allocation per datagram.
//
//   - Queries: one recvmmsg takes up to udpBatch datagrams from the
//     frontend; each goes to its flow's backend with one write. A batch
//     shorter than udpBatch emptied the socket, so no read is spent on
//     EAGAIN. After udpRounds full batches the frontend waits its turn
//     behind the worker's other events (w.udpAgain).
//   - Replies: a flow's socket is read with recvmmsg into the worker's
//     reply batch, which gathers the replies of every flow of one frontend
//     made ready by the same epoll harvest; one sendmmsg sends them all,
//     each to its client (and, for a socket on the unspecified address,
//     from the address the client wrote to: IP_PKTINFO, built once per
//     flow; see answerFromDst).
//   - A flow ends after UDPIdleTimeout without datagrams either way (a
//     timer in the worker's heap), when the backend answers ICMP port
//     unreachable (the flow socket's pending error, read as ECONNREFUSED;
//     passive health counts it), when Apply removes its endpoint, or at
//     shutdown: the same reasons, records and metrics as the goroutine
//     path (udp.go).
//
// One frontend is one worker's: a single very busy UDP Service (cluster
// DNS on a large node) is served by one core, as the goroutine path's
// single reader per frontend was. SO_REUSEPORT sockets per worker would
// spread it (the kernel keeps a client's datagrams on one socket, so its
// flow stays on one worker); not done yet.
//
// Measured in a three-namespace rig joined by veths (dnsperf, 16 clients,
// 200 queries outstanding, one dnsmasq behind; 3 interleaved turns of 5 s,
// 2026-11-26), against nginx stream's UDP proxy configured as the bench's:
//
//	                     queries/s      CPU µs per query
//	goroutines (udp.go)  37.4k–39.6k    19.2–20.7
//	this event loop      38.7k–49.3k    12.2–14.3
//	nginx stream         44.4k–46.2k    14.8–15.5
//
// perf had put a fifth of the goroutine path's CPU in the Go runtime
// (waking a goroutine per reply, the frontend socket's lock, allocations
// and their collection, sysmon); here Go code is under 5 %.

const udpRounds = 4 // full recvmmsg batches taken from a frontend per turn

// loopUDP is a UDP frontend served by worker w. Everything but the
// immutable fields belongs to w's goroutine.
type loopUDP struct {
	f        *Forwarder
	w        *worker
	frontend lb.Frontend
	fd       int
	port     uint16
	v6       bool
	pktinfo  bool // the socket's address is unspecified: read and answer from each datagram's destination (answerFromDst)

	flows  map[netip.AddrPort]*loopFlow
	drops  dropMeter
	queued bool // in w.udpAgain
	closed bool
}

// loopFlow is one client's flow through a loopUDP.
type loopFlow struct {
	fe      *loopUDP
	client  netip.AddrPort
	name    unix.RawSockaddrInet6 // the client's address as the frontend socket gave it (IPv4 fits)
	namelen uint32
	oob     []byte // IP_PKTINFO for replies, when fe.pktinfo
	pool    *lb.Pool
	backend *lb.Backend
	fd      int
	rec     connlog.Record
	start   time.Time
	last    int64 // w.now at the last datagram either way
	idle    timer
	in, out int64
	drops   dropMeter
	ended   bool
}

// udpBatchBufs is a worker's recvmmsg or sendmmsg batch: headers, and
// buffers big enough for any datagram (allocated on first use; only the
// pages datagrams touch become resident).
type udpBatchBufs struct {
	hdrs  [udpBatch]unix.Mmsghdr
	iovs  [udpBatch]unix.Iovec
	names [udpBatch]unix.RawSockaddrInet6
	ctl   [udpBatch][64]byte
	bufs  [udpBatch][]byte
}

func newUDPBatchBufs() *udpBatchBufs {
	b := &udpBatchBufs{}
	for i := range b.bufs {
		b.bufs[i] = make([]byte, maxDatagram)
		b.iovs[i].Base = &b.bufs[i][0]
		b.hdrs[i].Hdr.Iov = &b.iovs[i]
		b.hdrs[i].Hdr.SetIovlen(1)
	}
	return b
}

// forRecv readies slots [from, to) for recvmmsg: full-size buffers, and
// room for the sender's address and control messages when named.
func (b *udpBatchBufs) forRecv(from, to int, named, ctl bool) {
	for i := from; i < to; i++ {
		b.iovs[i].SetLen(maxDatagram)
		h := &b.hdrs[i].Hdr
		h.Name, h.Namelen = nil, 0
		if named {
			h.Name = (*byte)(unsafe.Pointer(&b.names[i]))
			h.Namelen = unix.SizeofSockaddrInet6
		}
		h.Control = nil
		h.SetControllen(0)
		if ctl {
			h.Control = &b.ctl[i][0]
			h.SetControllen(len(b.ctl[i]))
		}
		h.Flags = 0
		b.hdrs[i].Len = 0
	}
}

// sysMmsg is recvmmsg or sendmmsg (trap) on fd, non-blocking.
func sysMmsg(trap uintptr, fd int, hdrs []unix.Mmsghdr) (int, error) {
	for {
		n, _, e := unix.RawSyscall6(trap, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(hdrs))), uintptr(len(hdrs)), unix.MSG_DONTWAIT, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), nil
	}
}

// serveUDP takes pc over: its descriptor is duplicated into a raw one on
// the next worker in turn, and pc closed (out of Go's poller).
func (e *loopEngine) serveUDP(k lb.Frontend, pc *net.UDPConn, v6 bool) (udpSocket, error) {
	rc, err := pc.SyscallConn()
	if err != nil {
		pc.Close()
		return nil, err
	}
	fd, err := dupNonblock(rc)
	pc.Close()
	if err != nil {
		return nil, err
	}
	port := uint16(0)
	if a, err := sockName(fd); err == nil {
		port = a.Port()
	}
	fe := &loopUDP{f: e.f, frontend: k, fd: fd, port: port, v6: v6, pktinfo: e.f.answerFromDst(k),
		flows: map[netip.AddrPort]*loopFlow{}}
	if fe.pktinfo {
		level, name := unix.IPPROTO_IP, unix.IP_PKTINFO
		if v6 {
			level, name = unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO
		}
		if err := unix.SetsockoptInt(fd, level, name, 1); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("enabling IP_PKTINFO on UDP socket for %v: %w", k, err)
		}
	}
	fe.w = e.workers[int(e.nextUDP.Add(1))%len(e.workers)]
	errc := make(chan error, 1)
	fe.w.post(func(w *worker) {
		if w.quit {
			errc <- errors.New("the event loop has stopped")
			return
		}
		if w.udpRx == nil {
			w.udpRx, w.udpTx = newUDPBatchBufs(), newUDPBatchBufs()
		}
		errc <- w.register(fd, fdEntry{ufe: fe}, unix.EPOLLIN|unix.EPOLLET)
	})
	if err := <-errc; err != nil {
		unix.Close(fd)
		return nil, err
	}
	return fe, nil
}

func (fe *loopUDP) localPort() uint16 { return fe.port }

func (fe *loopUDP) file() (*os.File, error) {
	fd, err := fe.w.dupOwned(fe.fd, &fe.closed, nil)
	if err != nil {
		return nil, fmt.Errorf("duplicating UDP socket: %w", err)
	}
	return os.NewFile(uintptr(fd), udpSocketName(fe.frontend)), nil
}

// on runs fn on fe's worker and waits for it.
func (fe *loopUDP) on(fn func(w *worker)) {
	done := make(chan struct{})
	fe.w.post(func(w *worker) { fn(w); close(done) })
	<-done
}

func (fe *loopUDP) close() { fe.on(func(w *worker) { w.udpClose(fe) }) }

func (fe *loopUDP) dropStale(snap *lb.Snapshot) {
	fe.on(func(w *worker) {
		for _, fl := range fe.flows {
			if !snap.HasEndpoint(fl.pool.Service.Name, fl.backend.Addr) {
				w.udpEnd(fl, reasonDrain)
			}
		}
	})
}

func (fe *loopUDP) readDrops() {
	fe.on(func(w *worker) {
		if fe.closed {
			return
		}
		if n, ok := fdDrops(fe.fd); ok {
			fe.drops.add(n, fe.f.m.udpDropsFrontend)
		}
		for _, fl := range fe.flows {
			fl.readDrops()
		}
	})
}

func (fl *loopFlow) readDrops() {
	if n, ok := fdDrops(fl.fd); ok {
		fl.drops.add(n, fl.fe.f.m.udpDropsReply)
	}
}

// udpClose ends fe's flows and closes its socket; closing twice does
// nothing (the worker closes what it serves when it stops).
func (w *worker) udpClose(fe *loopUDP) {
	if fe.closed {
		return
	}
	if w.udpTxFE == fe {
		w.udpFlush()
	}
	if n, ok := fdDrops(fe.fd); ok {
		fe.drops.add(n, fe.f.m.udpDropsFrontend)
	}
	for _, fl := range fe.flows {
		w.udpEnd(fl, reasonShutdown)
	}
	w.closeShared(fe.fd)
	fe.closed = true
	fe.f.m.Listeners.Dec()
}

// udpRead takes the clients' datagrams queued at fe and sends each to its
// flow's backend.
func (w *worker) udpRead(fe *loopUDP) {
	b := w.udpRx
	var wall time.Time // read once per batch that opens a flow
	for range udpRounds {
		b.forRecv(0, udpBatch, true, fe.pktinfo)
		n, err := sysMmsg(unix.SYS_RECVMMSG, fe.fd, b.hdrs[:])
		if err != nil {
			if err != unix.EAGAIN {
				w.log.Debug("reading UDP frontend", zap.Stringer("frontend", fe.frontend), zap.Error(err))
			}
			return
		}
		wall = time.Time{}
		for i := range n {
			h := &b.hdrs[i]
			client := rawAddrPort((*unix.RawSockaddrAny)(unsafe.Pointer(&b.names[i])))
			fl := fe.flows[client]
			if fl == nil {
				if wall.IsZero() {
					wall = time.Now()
				}
				if fl = w.udpOpen(fe, client, &b.names[i], h.Hdr.Namelen, b.ctl[i][:h.Hdr.Controllen], wall); fl == nil {
					continue
				}
			}
			size := int(h.Len)
			if _, err := sysWrite(fl.fd, b.bufs[i][:size]); err != nil {
				if isRefused(err) {
					w.udpRefused(fl)
				}
				continue // a full socket buffer drops the datagram, as the kernel would
			}
			fl.in += int64(size)
			fl.last = w.now
			fe.f.m.udpIn.Inc()
		}
		if n < udpBatch {
			return
		}
	}
	if !fe.queued { // more may be queued: after the others' events
		fe.queued = true
		w.udpAgain = append(w.udpAgain, fe)
	}
}

func (w *worker) udpReadAgain() {
	fes := w.udpAgain
	w.udpAgain = nil
	for _, fe := range fes {
		fe.queued = false
		if !fe.closed {
			w.udpRead(fe)
		}
	}
}

// udpOpen opens client's flow through fe; nil means the datagram is
// dropped. name and namelen are the client's address as read, ctl the
// datagram's control messages.
func (w *worker) udpOpen(fe *loopUDP, client netip.AddrPort, name *unix.RawSockaddrInet6, namelen uint32, ctl []byte, now time.Time) *loopFlow {
	f := fe.f
	var local netip.Addr
	if fe.pktinfo {
		local = pktinfoDst(ctl)
	}
	fd := -1
	pool, b, rec, ok := f.openUDPFlow(fe.frontend, client, local, len(fe.flows), now, func(b *lb.Backend) error {
		var err error
		if fd, err = w.dialUDP(b.Addr); err != nil {
			return err
		}
		// Watched before the flow counts as opened: an epoll that takes
		// no more (ENOMEM, ENOSPC) fails the dial as this host's.
		if err = w.register(fd, fdEntry{}, unix.EPOLLIN|unix.EPOLLET); err != nil {
			sysClose(fd)
			fd = -1
		}
		return err
	})
	if !ok {
		return nil
	}
	fl := &loopFlow{fe: fe, client: client, name: *name, namelen: namelen, pool: pool, backend: b, fd: fd, rec: rec,
		start: now, last: w.now, idle: timer{idx: -1, kind: timerUDPIdle}}
	fl.idle.u = fl
	if fe.pktinfo && local.IsValid() {
		if fe.v6 {
			fl.oob = unix.PktInfo6(&unix.Inet6Pktinfo{Addr: local.As16()})
		} else {
			fl.oob = unix.PktInfo4(&unix.Inet4Pktinfo{Spec_dst: local.As4()})
		}
	}
	w.fds[fd].ufl = fl
	fe.flows[client] = fl
	w.timers.set(&fl.idle, w.now+int64(f.cfg.UDPIdleTimeout))
	return fl
}

// dialUDP opens a non-blocking UDP socket connected to a, with the mark
// and receive buffer the configuration asks for.
func (w *worker) dialUDP(a netip.AddrPort) (int, error) {
	a = netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
	fd, err := newSocket(a.Addr(), unix.SOCK_DGRAM, w.f.cfg.Mark)
	if err != nil {
		return -1, fmt.Errorf("opening UDP socket (SO_MARK %#x): %w", w.f.cfg.Mark, err)
	}
	if n := w.f.cfg.UDPReceiveBuffer; n > 0 {
		if err := fdReceiveBuffer(fd, n); err != nil {
			sysClose(fd)
			return -1, fmt.Errorf("setting a UDP flow's receive buffer: %w", err)
		}
	}
	if err := unix.Connect(fd, sockaddr(a)); err != nil {
		sysClose(fd)
		return -1, fmt.Errorf("connecting UDP socket to %v: %w", a, err)
	}
	return fd, nil
}

// pktinfoDst is the destination address an IP_PKTINFO or IPV6_PKTINFO
// control message in ctl gives, if there is one.
func pktinfoDst(ctl []byte) netip.Addr {
	msgs, err := unix.ParseSocketControlMessage(ctl)
	if err != nil {
		return netip.Addr{}
	}
	for _, m := range msgs {
		switch {
		case m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_PKTINFO && len(m.Data) >= unix.SizeofInet4Pktinfo:
			pi := (*unix.Inet4Pktinfo)(unsafe.Pointer(&m.Data[0]))
			return netip.AddrFrom4(pi.Addr)
		case m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_PKTINFO && len(m.Data) >= unix.SizeofInet6Pktinfo:
			pi := (*unix.Inet6Pktinfo)(unsafe.Pointer(&m.Data[0]))
			return netip.AddrFrom16(pi.Addr).Unmap()
		}
	}
	return netip.Addr{}
}

// udpReply moves the replies queued at fl's socket into the worker's reply
// batch, sending the batch whenever it fills (and when the harvest is
// done: udpFlush).
func (w *worker) udpReply(fl *loopFlow) {
	b := w.udpTx
	for !fl.ended {
		if w.udpTxN == udpBatch || (w.udpTxFE != nil && w.udpTxFE != fl.fe) {
			w.udpFlush()
		}
		from := w.udpTxN
		b.forRecv(from, udpBatch, false, false)
		n, err := sysMmsg(unix.SYS_RECVMMSG, fl.fd, b.hdrs[from:])
		if err != nil {
			switch {
			case err == unix.EAGAIN:
			case isRefused(err):
				w.udpRefused(fl)
			default:
				w.udpEnd(fl, reasonBackendReset)
			}
			return
		}
		w.udpTxFE = fl.fe
		for i := from; i < from+n; i++ {
			h := &b.hdrs[i].Hdr
			b.iovs[i].SetLen(int(b.hdrs[i].Len))
			b.names[i] = fl.name
			h.Name, h.Namelen = (*byte)(unsafe.Pointer(&b.names[i])), fl.namelen
			if len(fl.oob) > 0 {
				h.Control = &fl.oob[0]
				h.SetControllen(len(fl.oob))
			}
			w.udpTxFlow[i] = fl
		}
		w.udpTxN += n
		if n < udpBatch-from {
			return // the socket is empty
		}
	}
}

// udpFlush sends the reply batch to the clients with one sendmmsg.
func (w *worker) udpFlush() {
	fe, n := w.udpTxFE, w.udpTxN
	w.udpTxFE, w.udpTxN = nil, 0
	if n == 0 || fe.closed {
		return
	}
	b := w.udpTx
	for sent := 0; sent < n; {
		k, err := sysMmsg(unix.SYS_SENDMMSG, fe.fd, b.hdrs[sent:n])
		if err == unix.EAGAIN { // the socket's send buffer is full: drop the rest, as the kernel would
			w.log.Debug("sending UDP replies", zap.Stringer("frontend", fe.frontend), zap.Int("dropped", n-sent), zap.Error(err))
			break
		}
		if err != nil { // this reply's own failure (its client unreachable, say): skip it, send the others
			w.log.Debug("sending a UDP reply", zap.Stringer("frontend", fe.frontend), zap.Stringer("client", w.udpTxFlow[sent].client), zap.Error(err))
			sent++
			continue
		}
		for i := sent; i < sent+k; i++ {
			fl := w.udpTxFlow[i]
			fl.out += int64(b.hdrs[i].Len)
			fl.last = w.now
		}
		fe.f.m.udpOut.Add(float64(k))
		sent += k
	}
	clear(w.udpTxFlow[:n])
}

// udpRefused handles ICMP port unreachable from fl's backend: passive
// health counts it like a refused TCP dial, and the flow ends so the
// client's next datagram goes to another backend.
func (w *worker) udpRefused(fl *loopFlow) {
	fl.backend.ReportFailure(time.Now())
	fl.fe.f.m.dialRefused.Inc()
	w.udpEnd(fl, reasonBackendReset)
}

// udpIdle ends fl if it has been idle for UDPIdleTimeout, else waits for
// the rest of it.
func (w *worker) udpIdle(fl *loopFlow) {
	until := fl.last + int64(fl.fe.f.cfg.UDPIdleTimeout)
	if w.now < until {
		w.timers.set(&fl.idle, until)
		return
	}
	w.udpEnd(fl, reasonIdle)
}

// udpEnd closes fl's socket, forgets it and logs it.
func (w *worker) udpEnd(fl *loopFlow, reason closeReason) {
	if fl.ended {
		return
	}
	fl.ended = true
	if w.udpTxFE == fl.fe && w.udpTxN > 0 {
		w.udpFlush() // replies read in this harvest, some maybe fl's: sent and counted before its record is
	}
	fl.readDrops()
	w.timers.stop(&fl.idle)
	w.closeFD(fl.fd)
	fe := fl.fe
	if fe.flows[fl.client] == fl {
		delete(fe.flows, fl.client)
	}
	fe.f.udpFlowDone(&fl.rec, fl.backend, reason, fl.in, fl.out, fl.start)
}
