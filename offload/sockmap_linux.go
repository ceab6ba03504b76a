package offload

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Sockmap owns the verdict program and its three maps:
//
//   - socks, a SOCKHASH from socket cookie to socket, holding both sockets
//     of every offloaded pair; the program is attached to it as the
//     stream verdict, so it runs for every socket in it;
//   - targets, a SOCKHASH holding the same sockets with no program: where
//     the verdict redirects to. Every socket of a pair is in targets
//     before either is in socks, so no byte is ever redirected to a peer
//     not there yet (which drops it: with one map, a byte the backend
//     sent while the client was being inserted was lost);
//   - peers, a hash from socket cookie to {peer cookie, bytes}: where the
//     socket's bytes go, and how many have gone.
//
// A socket that is in socks but not in peers (a pair half removed) gets
// SK_PASS: its bytes stay on its own receive queue for user space.
//
// Its methods are safe for concurrent use (each is one or a few bpf(2)
// calls on maps the kernel serialises).
type Sockmap struct {
	prog    *ebpf.Program
	socks   *ebpf.Map
	targets *ebpf.Map
	peers   *ebpf.Map
}

// peer is a value of the peers map.
type peer struct {
	Cookie uint64 // the peer's socket cookie
	Bytes  uint64 // bytes this socket received and sent on to its peer
}

// New loads the program, creates the maps and attaches the program to the
// socket map. It is also the capability probe: an error (wrapping
// ErrUnsupported when the kernel said no) says why offload cannot run.
func New(cfg Config) (*Sockmap, error) {
	n := uint32(cfg.maxPairs())
	socks, err := ebpf.NewMap(&ebpf.MapSpec{Name: "svcproxy_socks", Type: ebpf.SockHash,
		KeySize: 8, ValueSize: 8, MaxEntries: 2 * n})
	if err != nil {
		return nil, fmt.Errorf("%w: creating the socket hash: %v", ErrUnsupported, err)
	}
	s := &Sockmap{socks: socks}
	if s.targets, err = ebpf.NewMap(&ebpf.MapSpec{Name: "svcproxy_targets", Type: ebpf.SockHash,
		KeySize: 8, ValueSize: 8, MaxEntries: 2 * n}); err != nil {
		s.Close()
		return nil, fmt.Errorf("%w: creating the target socket hash: %v", ErrUnsupported, err)
	}
	if s.peers, err = ebpf.NewMap(&ebpf.MapSpec{Name: "svcproxy_peers", Type: ebpf.Hash,
		KeySize: 8, ValueSize: uint32(unsafe.Sizeof(peer{})), MaxEntries: 2 * n}); err != nil {
		s.Close()
		return nil, fmt.Errorf("%w: creating the peer map: %v", ErrUnsupported, err)
	}
	if s.prog, err = ebpf.NewProgram(&ebpf.ProgramSpec{Name: "svcproxy_verdict", Type: ebpf.SkSKB,
		AttachType: ebpf.AttachSkSKBStreamVerdict, License: "GPL", Instructions: verdict(s.targets, s.peers)}); err != nil {
		s.Close()
		return nil, fmt.Errorf("%w: loading the verdict program: %v", ErrUnsupported, err)
	}
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: socks.FD(), Program: s.prog,
		Attach: ebpf.AttachSkSKBStreamVerdict}); err != nil {
		s.Close()
		return nil, fmt.Errorf("%w: attaching the verdict program: %v", ErrUnsupported, err)
	}
	return s, nil
}

// SK_PASS and SK_DROP, the verdicts of an sk_skb program.
const (
	skDrop = 0
	skPass = 1
)

// verdict is the stream verdict program:
//
//	if skb.len == 0 { return SK_DROP }     // a bare FIN: see below
//	cookie := bpf_get_socket_cookie(skb)
//	p := peers[cookie]
//	if p == nil { return SK_PASS }          // not (or no longer) paired: user space reads it
//	atomic p.bytes += skb.len
//	key := p.cookie
//	return bpf_sk_redirect_hash(skb, targets, &key, 0) // out of the peer (egress)
//
// The verdict sees every skb on the receive queue (tcp_read_skb), a FIN's
// without data too, after TCP has taken the FIN into account. Redirected,
// a zero-length skb breaks the peer: the psock's sender treats sending 0
// bytes as a hard error, sets EPIPE on the peer socket and sends nothing
// more (sk_psock_backlog). So it is dropped: the FIN reaches user space as
// a read of 0 anyway, and user space passes it on.
func verdict(targets, peers *ebpf.Map) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),              // skb
		asm.LoadMem(asm.R1, asm.R6, 0, asm.Word), // skb->len
		asm.JNE.Imm(asm.R1, 0, "data"),
		asm.Mov.Imm(asm.R0, skDrop),
		asm.Return(),
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("data"),
		asm.FnGetSocketCookie.Call(),
		asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
		asm.LoadMapPtr(asm.R1, peers.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.LoadMem(asm.R1, asm.R6, 0, asm.Word),        // skb->len
		asm.AddAtomic.Mem(asm.R7, asm.R1, asm.DWord, 8), // p.bytes
		asm.LoadMem(asm.R1, asm.R7, 0, asm.DWord),       // the peer's cookie
		asm.StoreMem(asm.RFP, -16, asm.R1, asm.DWord),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.LoadMapPtr(asm.R2, targets.FD()),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -16),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnSkRedirectHash.Call(),
		asm.Return(),
		asm.Mov.Imm(asm.R0, skPass).WithSymbol("pass"),
		asm.Return(),
	}
}

// Cookie is the socket cookie of fd (SO_COOKIE), the key it has in the maps.
func Cookie(fd int) (uint64, error) {
	var c uint64
	l := uint32(8)
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_COOKIE,
		uintptr(unsafe.Pointer(&c)), uintptr(unsafe.Pointer(&l)), 0); e != 0 {
		return 0, fmt.Errorf("reading SO_COOKIE: %w", e)
	}
	return c, nil
}

// Insert offloads the connected TCP sockets client and backend: from now
// on what either receives is sent out of the other by the kernel, bytes
// already on either socket's receive queue first. On error nothing is left
// inserted.
func (s *Sockmap) Insert(client, backend int) (Pair, error) {
	var p Pair
	var err error
	if p.Client, err = Cookie(client); err != nil {
		return Pair{}, err
	}
	if p.Backend, err = Cookie(backend); err != nil {
		return Pair{}, err
	}
	if err := s.peers.Update(p.Client, peer{Cookie: p.Backend}, ebpf.UpdateNoExist); err != nil {
		return Pair{}, fmt.Errorf("inserting the client's peer: %w", err)
	}
	if err := s.peers.Update(p.Backend, peer{Cookie: p.Client}, ebpf.UpdateNoExist); err != nil {
		s.peers.Delete(p.Client)
		return Pair{}, fmt.Errorf("inserting the backend's peer: %w", err)
	}
	// Both in targets before either runs the verdict (see Sockmap).
	for _, m := range []*ebpf.Map{s.targets, s.socks} {
		if err := m.Update(p.Backend, uint64(backend), ebpf.UpdateNoExist); err != nil {
			s.Remove(p)
			return Pair{}, fmt.Errorf("inserting the backend socket: %w", err)
		}
		if err := m.Update(p.Client, uint64(client), ebpf.UpdateNoExist); err != nil {
			s.Remove(p)
			return Pair{}, fmt.Errorf("inserting the client socket: %w", err)
		}
	}
	// Bytes that came before the sockets were in socks wait on their
	// receive queues until the next segment runs the verdict, which a
	// client waiting for its answer never sends. Setting SO_RCVLOWAT runs
	// the socket's data_ready (tcp_set_rcvlowat), now the verdict's, under
	// the socket lock: what is queued goes first, in order.
	for _, fd := range []int{backend, client} {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVLOWAT, 1); err != nil {
			s.Remove(p)
			return Pair{}, fmt.Errorf("flushing queued bytes through the verdict: %w", err)
		}
	}
	return p, nil
}

// Remove takes p out of the maps; what is missing is no error. Closing a
// socket takes it out of socks by itself, not out of peers.
func (s *Sockmap) Remove(p Pair) {
	for _, c := range []uint64{p.Client, p.Backend} {
		_ = s.socks.Delete(c) // a socket already closed is gone from both socket hashes
		_ = s.targets.Delete(c)
		_ = s.peers.Delete(c)
	}
}

// Bytes reads the bytes the kernel moved for p.
func (s *Sockmap) Bytes(p Pair) (Counts, error) {
	var in, out peer
	if err := s.peers.Lookup(p.Client, &in); err != nil {
		return Counts{}, fmt.Errorf("reading the client's count: %w", err)
	}
	if err := s.peers.Lookup(p.Backend, &out); err != nil {
		return Counts{}, fmt.Errorf("reading the backend's count: %w", err)
	}
	return Counts{In: in.Bytes, Out: out.Bytes}, nil
}

// Written is how many bytes have ever been written into the TCP socket fd
// (acknowledged plus still queued), whoever wrote them: user space, or the
// kernel for a peer. It is read in the order that never overstates it.
func Written(fd int) (uint64, error) {
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return 0, fmt.Errorf("reading TCP_INFO: %w", err)
	}
	q, err := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
	if err != nil {
		return 0, fmt.Errorf("reading SIOCOUTQ: %w", err)
	}
	return info.Bytes_acked + uint64(q), nil
}

// Close takes every pair still inserted out of the maps (their sockets
// fall back to their own receive queues), detaches the program and closes
// the maps. Without the first step the maps and the program outlived
// their descriptors and kept redirecting such a socket's bytes
// (TestPrivilegedCloseFrees): the program holds the maps it names, and the
// sockets keep their psock, verdict included, until they leave the maps.
func (s *Sockmap) Close() error {
	if s.peers != nil {
		var cookies []uint64
		var c uint64
		var v peer
		for it := s.peers.Iterate(); it.Next(&c, &v); {
			cookies = append(cookies, c)
		}
		for _, c := range cookies {
			s.Remove(Pair{Client: c})
		}
	}
	var errs []error
	if s.prog != nil {
		_ = link.RawDetachProgram(link.RawDetachProgramOptions{Target: s.socks.FD(), Program: s.prog,
			Attach: ebpf.AttachSkSKBStreamVerdict})
		errs = append(errs, s.prog.Close())
	}
	for _, m := range []*ebpf.Map{s.socks, s.targets, s.peers} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}
