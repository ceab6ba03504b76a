package forwarder

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/svcproxy/svcproxy/connlog"
	"github.com/svcproxy/svcproxy/lb"
)

// UDP forwarding
//
// Each UDP frontend has its own socket, so a datagram's Service is known
// from the socket it arrived on and REDIRECT's header rewriting loses
// nothing: with Redirect the socket takes an ephemeral port that steering
// rules send that one frontend to (see UDPPorts); with BindFrontends it is
// bound to the frontend itself. A flow is a client address and port: its
// first datagram picks a backend (affinity applies) and opens a connected
// socket to it; later datagrams of the flow use that socket, and replies
// read from it go back to the client from the address the client wrote to
// (IP_PKTINFO, where the socket's address is unspecified: see
// answerFromDst), so connected client sockets such as resolvers accept
// them.
// Frontend reads are batched with recvmmsg; replies gathered from a flow's
// socket go out with one sendmmsg. A flow ends after UDPIdleTimeout without
// datagrams either way, or when its backend answers ICMP port unreachable,
// which also counts as a failure for passive health: the client's next
// datagram opens a new flow to another backend.
//
// This file serves UDP with goroutines: a reader per frontend socket and
// one per flow for its replies. On Linux the event loop serves the same
// flows itself (udp_loop_linux.go); openUDPFlow and udpFlowDone are what
// the two share.

const (
	maxDatagram = 64 << 10 // never truncate: larger than any UDP payload
	udpBatch    = 16       // datagrams per recvmmsg / sendmmsg
)

// datagramPool holds maxDatagram-sized buffers a flow's replies are read
// into, borrowed for one read; smallPool holds the smallDatagram-sized
// buffers a reply that fits is copied into and held in until it is sent
// (a DNS answer is a few hundred bytes: a batch of 16 queued replies held
// 16 × 64 KiB before, which a busy resolver's flows multiplied into tens of
// MiB of heap). Idle flows hold neither.
var (
	datagramPool = sync.Pool{New: func() any { b := make([]byte, maxDatagram); return &b }}
	smallPool    = sync.Pool{New: func() any { b := make([]byte, smallDatagram); return &b }}
)

// smallDatagram is the size of smallPool's buffers.
const smallDatagram = 2 << 10

// keepDatagram returns a buffer holding the n bytes read into scratch:
// one of smallPool's when they fit, else a copy of their own.
func keepDatagram(scratch []byte, n int) *[]byte {
	var bp *[]byte
	if n <= smallDatagram {
		bp = smallPool.Get().(*[]byte)
	} else {
		b := make([]byte, n)
		bp = &b
	}
	copy(*bp, scratch[:n])
	return bp
}

// releaseDatagram gives back a buffer keepDatagram returned.
func releaseDatagram(bp *[]byte) {
	if cap(*bp) == smallDatagram {
		smallPool.Put(bp)
	}
}

// udpSocket is one UDP frontend's socket and its flows, served by
// goroutines (udpFrontend: a reader per frontend, one per flow for the
// replies) or, on Linux, by an event loop (loopUDP, udp_loop_linux.go).
// Its methods are called with Forwarder.mu held.
type udpSocket interface {
	localPort() uint16
	file() (*os.File, error) // a duplicate of the socket, for a successor
	dropStale(snap *lb.Snapshot)
	readDrops() // brings the drop counters up to date
	close()     // ends the flows and closes the socket
}

// udpServer is an engine that serves UDP frontends itself: serveUDP takes
// over pc, already bound and optioned.
type udpServer interface {
	serveUDP(k lb.Frontend, pc *net.UDPConn, v6 bool) (udpSocket, error)
}

// udpFrontend is one UDP frontend's socket and its flows, served by
// goroutines.
type udpFrontend struct {
	f        *Forwarder
	frontend lb.Frontend
	conn     *net.UDPConn
	batch    batchConn
	v6       bool
	port     uint16

	mu    sync.Mutex // guards flows and writes to batch
	flows map[netip.AddrPort]*udpFlow
	done  chan struct{}
	drops dropMeter
}

// dropMeter turns a socket's drop count (the kernel's, cumulative) into
// increments of a counter.
type dropMeter struct {
	mu   sync.Mutex
	seen uint32
}

// read adds what the socket behind raw dropped since the last read to c.
func (d *dropMeter) read(raw syscall.RawConn, c prometheus.Counter) {
	if n, ok := socketDrops(raw); ok {
		d.add(n, c)
	}
}

// add adds to c what n, the socket's cumulative drop count, says is new.
// Counts are read before the lock is taken, so two readers (a scrape and
// the flow's end) may bring theirs in the wrong order: one older than the
// last seen adds nothing, where taken as new it would add about 2^32.
func (d *dropMeter) add(n uint32, c prometheus.Counter) {
	d.mu.Lock()
	delta := int32(n - d.seen) // the difference wraps correctly past 2^32
	if delta > 0 {
		d.seen = n
	}
	d.mu.Unlock()
	if delta > 0 {
		c.Add(float64(delta))
	}
}

// readDrops brings svcproxy_forwarder_udp_receive_drops_total up to date
// from every UDP socket open.
func (f *Forwarder) readDrops() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, fe := range f.udp {
		fe.readDrops()
	}
}

func (fe *udpFrontend) readDrops() {
	if raw, err := fe.conn.SyscallConn(); err == nil {
		fe.drops.read(raw, fe.f.m.udpDropsFrontend)
	}
	fe.mu.Lock()
	for _, fl := range fe.flows {
		fl.drops.read(fl.raw, fe.f.m.udpDropsReply)
	}
	fe.mu.Unlock()
}

func (fe *udpFrontend) localPort() uint16       { return fe.port }
func (fe *udpFrontend) file() (*os.File, error) { return fe.conn.File() }

// batchConn is what ipv4.PacketConn and ipv6.PacketConn share.
type batchConn interface {
	ReadBatch(ms []ipv4.Message, flags int) (int, error)
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

// udpFlow is one client's flow through a frontend.
type udpFlow struct {
	fe       *udpFrontend
	client   netip.AddrPort
	local    netip.Addr // the address the client wrote to, for replies
	pool     *lb.Pool
	backend  *lb.Backend
	upstream *net.UDPConn
	raw      syscall.RawConn
	out      batchConn // upstream, for sendmmsg
	start    time.Time

	last     atomic.Int64 // unix nanoseconds of the last datagram either way
	bytesIn  atomic.Int64
	bytesOut atomic.Int64
	reason   atomic.Uint32
	drops    dropMeter
}

// udpFrontendAddrs lists the UDP frontends of snap: fixed ones, and NodePorts
// as each of nodePortAddrs (unspecified addresses, one per family) with the
// NodePort.
func udpFrontendAddrs(snap *lb.Snapshot, nodePortAddrs []netip.Addr) map[lb.Frontend]bool {
	want := map[lb.Frontend]bool{}
	for _, b := range snap.Balancers() {
		if b.Service.Protocol != lb.UDP {
			continue
		}
		for fe := range snap.Frontends(b) {
			want[fe] = true
		}
		if np := snap.NodePort(b); np != 0 {
			for _, a := range nodePortAddrs {
				want[lb.Frontend{Protocol: lb.UDP, Addr: netip.AddrPortFrom(a, np)}] = true
			}
		}
	}
	return want
}

// udpNodePortAddrs are the unspecified addresses a UDP NodePort has a socket
// on: 0.0.0.0, and also :: when a Redirect address is IPv6, as steering
// rules then send IPv6 NodePort datagrams too (each family to its own
// socket: see redirect.Ports.UDP). Frontends bound directly (BindFrontends)
// serve UDP NodePorts over IPv6 too when Config.IPv6 says the node does.
func (f *Forwarder) udpNodePortAddrs() []netip.Addr {
	addrs := []netip.Addr{netip.IPv4Unspecified()}
	if f.cfg.BindFrontends && f.cfg.IPv6 || slices.ContainsFunc(f.cfg.Redirect, func(a netip.AddrPort) bool { return a.Addr().Is6() }) {
		addrs = append(addrs, netip.IPv6Unspecified())
	}
	return addrs
}

func udpSocketName(k lb.Frontend) string { return "udp/" + k.Addr.String() }

// UDPPorts returns, for every UDP frontend, the local port of its socket:
// what steering rules must redirect that frontend to.
func (f *Forwarder) UDPPorts() map[lb.Frontend]uint16 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[lb.Frontend]uint16, len(f.udp))
	for k, fe := range f.udp {
		out[k] = fe.localPort()
	}
	return out
}

// reconcileUDP opens and closes frontend sockets to match snap, and ends
// flows whose backend snap no longer lists. Called with f.mu held.
func (f *Forwarder) reconcileUDP(snap *lb.Snapshot) []error {
	if !f.cfg.BindFrontends && len(f.cfg.Redirect) == 0 {
		return nil
	}
	want := udpFrontendAddrs(snap, f.udpNodePortAddrs())
	for k, fe := range f.udp {
		if !want[k] {
			fe.close()
			delete(f.udp, k)
			f.socketsGen++
		}
	}
	var errs []error
	for k := range want {
		if fe := f.udp[k]; fe != nil {
			fe.dropStale(snap)
			continue
		}
		fe, err := f.openUDP(k)
		if err != nil {
			f.m.ListenErrors.Inc()
			f.log.Warn("cannot open UDP frontend socket", zap.Stringer("frontend", k), zap.Error(err))
			errs = append(errs, err)
			continue
		}
		f.udp[k] = fe
		f.socketsGen++
	}
	return errs
}

// answerFromDst reports whether frontend k's socket is bound to an
// unspecified address, so that its replies must name their source: the
// address each datagram arrived at (IP_PKTINFO). A NodePort's socket is;
// so is every socket with Redirect, bound to 0.0.0.0 or [::] and an
// ephemeral port. There a datagram REDIRECT took from a client on this
// node arrives at 127.0.0.1 (::1): conntrack turns the reply's source
// back into the Service's address only if it comes from there, and a
// source the kernel picks by route (the node's address) is dropped by a
// connected client socket, a resolver's (redirect.Ports says the same).
func (f *Forwarder) answerFromDst(k lb.Frontend) bool {
	return k.Addr.Addr().IsUnspecified() || !f.cfg.BindFrontends
}

func (f *Forwarder) openUDP(k lb.Frontend) (udpSocket, error) {
	bind := k.Addr
	v6 := k.Addr.Addr().Is6()
	if !f.cfg.BindFrontends { // redirect mode: an ephemeral port of the family
		if v6 {
			bind = netip.AddrPortFrom(netip.IPv6Unspecified(), 0)
		} else {
			bind = netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
		}
	}
	network := "udp4"
	if v6 {
		network = "udp6"
	}
	var pc *net.UDPConn
	var err error
	if file := f.inherit(udpSocketName(k)); file != nil {
		var c net.PacketConn
		if c, err = net.FilePacketConn(file); err == nil {
			pc = c.(*net.UDPConn)
		}
		file.Close()
	} else {
		pc, err = f.listenUDP(network, bind, k)
	}
	if err != nil {
		return nil, fmt.Errorf("opening UDP socket for %v: %w", k, err)
	}
	if n := f.cfg.UDPReceiveBuffer; n > 0 {
		if err := setReceiveBuffer(pc, n); err != nil {
			pc.Close()
			return nil, fmt.Errorf("setting the receive buffer of UDP socket for %v: %w", k, err)
		}
	}
	if srv, ok := f.tcp.(udpServer); ok {
		s, err := srv.serveUDP(k, pc, v6)
		if err != nil {
			return nil, fmt.Errorf("serving UDP socket for %v: %w", k, err)
		}
		f.m.Listeners.Inc()
		return s, nil
	}
	fe := &udpFrontend{f: f, frontend: k, conn: pc, v6: v6, flows: map[netip.AddrPort]*udpFlow{}, done: make(chan struct{}),
		port: pc.LocalAddr().(*net.UDPAddr).AddrPort().Port()}
	if fe.batch, err = newBatchConn(pc, k, v6); err != nil {
		pc.Close()
		return nil, err
	}
	f.m.Listeners.Inc()
	f.handlers.Add(1)
	go fe.readLoop()
	return fe, nil
}

// listenUDP binds a UDP frontend socket at bind; with steering, at the
// port Config.UDPPorts gives k when it is free.
func (f *Forwarder) listenUDP(network string, bind netip.AddrPort, k lb.Frontend) (*net.UDPConn, error) {
	if p := f.cfg.UDPPorts[k]; p != 0 && !f.cfg.BindFrontends {
		pc, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(bind.Addr(), p)))
		if err == nil {
			return pc, nil
		}
		f.log.Info("the UDP port a previous process steered this frontend to is taken; choosing another",
			zap.Stringer("frontend", k), zap.Uint16("port", p), zap.Error(err))
	}
	return net.ListenUDP(network, net.UDPAddrFromAddrPort(bind))
}

// close stops the frontend socket and ends its flows.
func (fe *udpFrontend) close() {
	fe.readDrops()
	fe.conn.Close()
	<-fe.done
	fe.mu.Lock()
	flows := make([]*udpFlow, 0, len(fe.flows))
	for _, fl := range fe.flows {
		flows = append(flows, fl)
	}
	fe.mu.Unlock()
	for _, fl := range flows {
		fl.end(reasonShutdown)
	}
	fe.f.m.Listeners.Dec()
}

// dropStale ends flows whose backend snap no longer lists: UDP has no
// connection to drain, so the client's next datagram picks a live backend
// (kube-proxy clears such conntrack entries for the same reason).
func (fe *udpFrontend) dropStale(snap *lb.Snapshot) {
	fe.mu.Lock()
	var stale []*udpFlow
	for _, fl := range fe.flows {
		if !snap.HasEndpoint(fl.pool.Service.Name, fl.backend.Addr) {
			stale = append(stale, fl)
		}
	}
	fe.mu.Unlock()
	for _, fl := range stale {
		fl.end(reasonDrain)
	}
}

// readLoop reads batches of datagrams from clients and sends each to its
// flow's backend, opening flows as needed.
func (fe *udpFrontend) readLoop() {
	defer fe.f.handlers.Done()
	defer close(fe.done)
	ms := make([]ipv4.Message, udpBatch)
	oobSize := len(ipv4.NewControlMessage(ipv4.FlagDst))
	if fe.v6 {
		oobSize = len(ipv6.NewControlMessage(ipv6.FlagDst))
	}
	for i := range ms {
		ms[i].Buffers = [][]byte{make([]byte, maxDatagram)}
		ms[i].OOB = make([]byte, oobSize)
	}
	var flows [udpBatch]*udpFlow
	var outs [udpBatch]ipv4.Message
	var bufs [udpBatch][1][]byte
	for {
		for i := range ms {
			ms[i].OOB = ms[i].OOB[:cap(ms[i].OOB)]
		}
		n, err := fe.batch.ReadBatch(ms, 0)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			fe.f.log.Debug("reading UDP frontend", zap.Stringer("frontend", fe.frontend), zap.Error(err))
			continue
		}
		now := time.Now()
		for i := range ms[:n] {
			m := &ms[i]
			flows[i] = nil
			ua, ok := m.Addr.(*net.UDPAddr)
			if !ok {
				continue
			}
			client := ua.AddrPort()
			client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
			flows[i] = fe.flow(client, fe.localAddr(m.OOB[:m.NN]), now)
		}
		// Each flow's datagrams of the batch, in order, with one write
		// (sendmmsg when there are several: a busy client's queries).
		for i := range ms[:n] {
			fl := flows[i]
			if fl == nil {
				continue
			}
			out := outs[:0]
			bytes := 0
			for j := i; j < n; j++ {
				if flows[j] == fl {
					flows[j] = nil
					bufs[len(out)][0] = ms[j].Buffers[0][:ms[j].N]
					out = append(out, ipv4.Message{Buffers: bufs[len(out)][:]})
					bytes += ms[j].N
				}
			}
			if err := fl.send(out); err != nil {
				if isRefused(err) {
					fl.refused(now)
				}
				continue
			}
			fl.bytesIn.Add(int64(bytes))
			fl.last.Store(now.UnixNano())
			fe.f.m.udpIn.Add(float64(len(out)))
		}
	}
}

// send writes datagrams to the flow's backend: one write, or one sendmmsg
// for several.
func (fl *udpFlow) send(out []ipv4.Message) error {
	if len(out) == 1 {
		_, err := fl.upstream.Write(out[0].Buffers[0])
		return err
	}
	for sent := 0; sent < len(out); {
		k, err := fl.out.WriteBatch(out[sent:], 0)
		if err != nil {
			return err
		}
		sent += k
	}
	return nil
}

// localAddr is the destination address of a received datagram.
func (fe *udpFrontend) localAddr(oob []byte) netip.Addr {
	var ip net.IP
	if fe.v6 {
		var cm ipv6.ControlMessage
		if cm.Parse(oob) == nil {
			ip = cm.Dst
		}
	} else {
		var cm ipv4.ControlMessage
		if cm.Parse(oob) == nil {
			ip = cm.Dst
		}
	}
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// flow returns client's flow, opening one (and its backend socket) for a new
// client. Nil means the datagram is dropped (no Service, no endpoints, no
// backend reachable, or the flow limit reached).
func (fe *udpFrontend) flow(client netip.AddrPort, local netip.Addr, now time.Time) *udpFlow {
	for range 2 { // again only when an Apply took the first one's backend away
		fl, routed := fe.open(client, local, now)
		if fl == nil {
			return nil
		}
		// Apply swaps the snapshot, then drops the flows whose endpoint
		// it removed. A flow routed by the snapshot before the swap and
		// put in the table after the drop is caught here; were the swap
		// later than this load, the drop finds it in the table.
		if routed == nil || fe.f.snap.Load().HasEndpoint(routed.Service.Name, fl.backend.Addr) {
			return fl
		}
		fe.mu.Lock()
		if fe.flows[client] == fl {
			delete(fe.flows, client)
		}
		fe.mu.Unlock()
		fl.end(reasonDrain)
	}
	return nil
}

// testHookUDPRouted, set only by tests, runs when the goroutine engine has
// routed a new UDP flow, before the flow joins its frontend's table.
var testHookUDPRouted atomic.Pointer[func()]

// open returns client's flow, opening it if it is new (then routed is its
// pool, else nil).
func (fe *udpFrontend) open(client netip.AddrPort, local netip.Addr, now time.Time) (fl *udpFlow, routed *lb.Pool) {
	fe.mu.Lock()
	fl = fe.flows[client]
	n := len(fe.flows)
	fe.mu.Unlock()
	if fl != nil {
		return fl, nil
	}
	var up *net.UDPConn
	var raw syscall.RawConn
	pool, b, rec, ok := fe.f.openUDPFlow(fe.frontend, client, local, n, now, func(b *lb.Backend) error {
		var err error
		if up, err = fe.f.dialUDP(b); err != nil {
			return err
		}
		if raw, err = up.SyscallConn(); err != nil {
			up.Close()
		}
		return err
	})
	if !ok {
		return nil, nil
	}
	if hook := testHookUDPRouted.Load(); hook != nil {
		(*hook)()
	}
	fl = &udpFlow{fe: fe, client: client, local: local, pool: pool, backend: b, upstream: up, raw: raw, start: now}
	if b.Addr.Addr().Is4() || b.Addr.Addr().Is4In6() {
		fl.out = ipv4.NewPacketConn(up)
	} else {
		fl.out = ipv6.NewPacketConn(up)
	}
	fl.last.Store(now.UnixNano())
	fe.mu.Lock()
	fe.flows[client] = fl
	fe.mu.Unlock()
	fe.f.handlers.Add(1)
	go fl.replyLoop(rec)
	return fl, pool
}

// openUDPFlow routes a new flow from client on frontend k (which holds
// flows flows already) and dials its backend with dial, trying others the
// way a TCP dial is retried. On success the backend is acquired and
// counted, and rec is the flow's connection log record so far; ok false
// means the datagram is dropped, counted and, for a failed dial, logged.
// local is the address the client wrote to, when k is unspecified.
func (f *Forwarder) openUDPFlow(k lb.Frontend, client netip.AddrPort, local netip.Addr, flows int, now time.Time,
	dial func(*lb.Backend) error) (pool *lb.Pool, b *lb.Backend, rec connlog.Record, ok bool) {
	rec = connlog.Record{Start: now, ID: f.nextID.Add(1), Protocol: "UDP", Client: client, Frontend: k.Addr}
	if k.Addr.Addr().IsUnspecified() && local.IsValid() {
		rec.Frontend = netip.AddrPortFrom(local, k.Addr.Port())
	}
	pool = f.route(lb.UDP, client.Addr(), k.Addr)
	switch {
	case pool == nil:
		f.m.udpNoService.Inc()
		return nil, nil, rec, false
	case len(pool.Backends()) == 0:
		f.m.udpNoEndpoints.Inc()
		return nil, nil, rec, false
	case f.cfg.MaxUDPFlows > 0 && int64(flows) >= f.cfg.MaxUDPFlows:
		f.m.udpLimit.Inc()
		return nil, nil, rec, false
	}
	rec.Service = pool.Service.Name.String()
	var tried lb.Tried
	for range f.cfg.DialTimeouts {
		b = pool.Pick(client.Addr(), &tried, now)
		if b == nil {
			break
		}
		tried.Add(b)
		err := dial(b)
		if rec.NAttempts < len(rec.Attempts) {
			rec.Attempts[rec.NAttempts] = connlog.Attempt{Backend: b.Addr, Err: err}
			rec.NAttempts++
		}
		if err != nil {
			if isLocalDialError(err) { // this host's shortage, not the backend's: every one would fail
				break
			}
			b.ReportFailure(now)
			continue
		}
		rec.Backend = b.Addr
		b.Acquire()
		f.m.udpFlowsOK.Inc()
		f.m.activeUDP.Inc()
		return pool, b, rec, true
	}
	f.m.udpDialFailed.Inc()
	rec.Failed, rec.CloseReason = true, "dial_failed"
	f.cfg.ConnLog.Log(&rec)
	return nil, nil, rec, false
}

// udpFlowDone accounts for a flow that ended for reason: it releases its
// backend, counts it and its bytes, and logs rec.
func (f *Forwarder) udpFlowDone(rec *connlog.Record, b *lb.Backend, reason closeReason, in, out int64, start time.Time) {
	b.Release()
	f.m.activeUDP.Dec()
	f.m.closes[reason].Inc()
	rec.BytesIn, rec.BytesOut = in, out
	f.m.bytesIn.Add(float64(in))
	f.m.bytesOut.Add(float64(out))
	rec.Duration = time.Since(start)
	rec.CloseReason = closeReasons[reason]
	if f.cfg.ConnLog.Sampled(rec.ID) {
		f.cfg.ConnLog.Log(rec)
	}
}

func (f *Forwarder) dialUDP(b *lb.Backend) (*net.UDPConn, error) {
	c, err := f.dialer.DialContext(context.Background(), "udp", b.Dial)
	if err != nil {
		return nil, err
	}
	uc := c.(*net.UDPConn)
	if n := f.cfg.UDPReceiveBuffer; n > 0 {
		if err := setReceiveBuffer(uc, n); err != nil {
			uc.Close()
			return nil, fmt.Errorf("setting a UDP flow's receive buffer: %w", err)
		}
	}
	return uc, nil
}

// replyLoop carries the backend's replies to the client until the flow
// ends: idle, refused, or closed by Apply or shutdown. It holds no buffer
// while waiting.
func (fl *udpFlow) replyLoop(rec connlog.Record) {
	f := fl.fe.f
	defer f.handlers.Done()
	idle := f.cfg.UDPIdleTimeout
	_ = fl.upstream.SetReadDeadline(time.Now().Add(idle))
	rb := newReplyBatch(fl)
	for {
		count, err := rb.read()
		if count > 0 {
			fl.sendReplies(rb.bufs[:count], rb.sizes[:count])
			for i := range count {
				releaseDatagram(rb.bufs[i])
			}
		}
		switch {
		case err == nil:
			continue
		case errors.Is(err, os.ErrDeadlineExceeded) && fl.reason.Load() == uint32(reasonNone):
			until := time.Unix(0, fl.last.Load()).Add(idle)
			if !time.Now().Before(until) {
				fl.end(reasonIdle)
				break // the switch; the loop ends below
			}
			_ = fl.upstream.SetReadDeadline(until)
			continue
		case isRefused(err):
			fl.refused(time.Now())
		default:
			fl.end(reasonBackendReset)
		}
		break
	}
	fl.finish(rec)
}

// sendReplies sends datagrams to the client with one sendmmsg, from the
// address the client wrote to.
func (fl *udpFlow) sendReplies(bufs []*[]byte, sizes []int) {
	fe := fl.fe
	var oob []byte
	if fl.local.IsValid() && fe.f.answerFromDst(fe.frontend) {
		if fe.v6 {
			oob = (&ipv6.ControlMessage{Src: fl.local.AsSlice()}).Marshal()
		} else {
			oob = (&ipv4.ControlMessage{Src: fl.local.AsSlice()}).Marshal()
		}
	}
	to := net.UDPAddrFromAddrPort(fl.client)
	var ms [udpBatch]ipv4.Message
	var bb [udpBatch][1][]byte
	total := 0
	for i, bp := range bufs {
		bb[i][0] = (*bp)[:sizes[i]]
		ms[i] = ipv4.Message{Buffers: bb[i][:], OOB: oob, Addr: to}
		total += sizes[i]
	}
	fe.mu.Lock()
	defer fe.mu.Unlock()
	for sent := 0; sent < len(bufs); {
		n, err := fe.batch.WriteBatch(ms[sent:len(bufs)], 0)
		if err != nil {
			fe.f.log.Debug("sending UDP replies", zap.Stringer("client", fl.client), zap.Error(err))
			return
		}
		sent += n
	}
	fl.bytesOut.Add(int64(total))
	fl.last.Store(time.Now().UnixNano())
	fe.f.m.udpOut.Add(float64(len(bufs)))
}

// refused handles ICMP port unreachable from the backend: passive health
// counts it like a refused TCP dial, and the flow ends so the client's next
// datagram goes to another backend.
func (fl *udpFlow) refused(now time.Time) {
	fl.backend.ReportFailure(now)
	fl.fe.f.m.dialRefused.Inc()
	fl.end(reasonBackendReset)
}

// end closes the flow's backend socket; replyLoop then finishes it.
func (fl *udpFlow) end(r closeReason) {
	fl.reason.CompareAndSwap(uint32(reasonNone), uint32(r))
	fl.drops.read(fl.raw, fl.fe.f.m.udpDropsReply)
	_ = fl.upstream.Close()
}

// finish removes the flow and logs it. Only replyLoop calls it.
func (fl *udpFlow) finish(rec connlog.Record) {
	fe, f := fl.fe, fl.fe.f
	fl.drops.read(fl.raw, f.m.udpDropsReply)
	_ = fl.upstream.Close()
	fe.mu.Lock()
	if fe.flows[fl.client] == fl {
		delete(fe.flows, fl.client)
	}
	fe.mu.Unlock()
	f.udpFlowDone(&rec, fl.backend, closeReason(fl.reason.Load()), fl.bytesIn.Load(), fl.bytesOut.Load(), fl.start)
}
