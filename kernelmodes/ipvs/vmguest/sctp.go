package main

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/svcproxy/svcproxy/internal/sctp"
	"github.com/svcproxy/svcproxy/internal/vmtest"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs/internal/cases"
)

// SCTP over real IPVS. The guest loads no SCTP module, so the kernel has no
// SCTP sockets; IPVS, conntrack and NAT handle SCTP without them. A probe
// sends one INIT chunk from a raw socket; each backend watches a raw socket
// for INITs and reports which one arrived (by its initiate tag) and from
// which source address. No association is ever set up: a backend is
// reached when the INIT is.

// sctpArrival is an INIT a backend saw.
type sctpArrival struct {
	backend int
	src     netip.Addr
	tag     uint32
}

var (
	sctpArrivals = make(chan sctpArrival, 64)
	sctpNext     atomic.Uint32 // initiate tags and source ports
)

// serveSCTP watches backend i's namespace for SCTP INITs.
func serveSCTP(b host, i int) error {
	var c net.PacketConn
	if err := vmtest.InNetNS(b.ns, func() error {
		var err error
		c, err = net.ListenPacket("ip4:132", "0.0.0.0")
		return err
	}); err != nil {
		return fmt.Errorf("raw SCTP socket: %w", err)
	}
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			p, err := sctp.Parse(buf[:n])
			if err != nil || p.Chunk != sctp.ChunkInit || p.DstPort != cases.SCTPPort {
				continue // a broken checksum or port never reaches a probe: it times out
			}
			src, _ := netip.AddrFromSlice(from.(*net.IPAddr).IP.To4())
			sctpArrivals <- sctpArrival{backend: i, src: src, tag: p.InitiateTag}
		}
	}()
	return nil
}

// sctpProbe sends one INIT from from to to and reports where it went: a
// backend (Reach), an ICMP port unreachable (Refused), another ICMP
// destination unreachable, or nothing.
func (g *guest) sctpProbe(from host, to netip.AddrPort) cases.Result {
	var conn *net.IPConn
	var icmpConn net.PacketConn
	err := vmtest.InNetNS(from.ns, func() error {
		var err error
		if conn, err = net.DialIP("ip4:132", nil, &net.IPAddr{IP: to.Addr().AsSlice()}); err != nil {
			return err
		}
		icmpConn, err = net.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	})
	if err != nil {
		o, d := classify(err)
		return cases.Result{Outcome: o, Backend: -1, Detail: d}
	}
	defer conn.Close()
	defer icmpConn.Close()
	res := cases.Result{Backend: -1}
	res.Client, _ = netip.AddrFromSlice(conn.LocalAddr().(*net.IPAddr).IP.To4())
	n := sctpNext.Add(1)
	srcPort, tag := uint16(40000+n%20000), 0x5c700000+n
	if _, err := conn.Write(sctp.Init(srcPort, to.Port(), tag)); err != nil {
		res.Outcome, res.Detail = classify(err)
		return res
	}
	unreachable := make(chan int, 1) // the ICMP code
	go func() {
		buf := make([]byte, 1500)
		icmpConn.SetReadDeadline(time.Now().Add(readTimeout))
		for {
			n, _, err := icmpConn.ReadFrom(buf)
			if err != nil {
				return
			}
			if code, ok := aboutOurs(buf[:n], to, srcPort); ok {
				unreachable <- code
				return
			}
		}
	}()
	deadline := time.After(readTimeout)
	for {
		select {
		case a := <-sctpArrivals:
			if a.tag != tag {
				continue // a late arrival of an earlier probe
			}
			res.Outcome, res.Backend, res.Src = cases.Reach, a.backend, a.src
			return res
		case code := <-unreachable:
			res.Outcome, res.Detail = outcomeUnreachable, fmt.Sprintf("ICMP destination unreachable, code %d", code)
			if code == 3 {
				res.Outcome = cases.Refused
			}
			return res
		case <-deadline:
			res.Outcome, res.Detail = outcomeTimeout, "no backend got the INIT and no ICMP error came back"
			return res
		}
	}
}

// aboutOurs reports whether b is an ICMP destination unreachable about an
// SCTP packet from srcPort to to, and its code.
func aboutOurs(b []byte, to netip.AddrPort, srcPort uint16) (int, bool) {
	msg, err := icmp.ParseMessage(1, b)
	if err != nil || msg.Type != ipv4.ICMPTypeDestinationUnreachable {
		return 0, false
	}
	body, ok := msg.Body.(*icmp.DstUnreach)
	if !ok {
		return 0, false
	}
	h, err := ipv4.ParseHeader(body.Data)
	if err != nil || h.Protocol != 132 || len(body.Data) < h.Len+4 {
		return 0, false
	}
	quoted := body.Data[h.Len:]
	dst, _ := netip.AddrFromSlice(h.Dst.To4())
	ok = dst == to.Addr() && binary.BigEndian.Uint16(quoted) == srcPort && binary.BigEndian.Uint16(quoted[2:]) == to.Port()
	return msg.Code, ok
}
