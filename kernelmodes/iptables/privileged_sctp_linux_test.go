//go:build linux

package iptables

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/svcproxy/svcproxy/internal/kerneltest"
	"github.com/svcproxy/svcproxy/internal/sctp"
	"github.com/svcproxy/svcproxy/internal/topology"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// arrival is an SCTP packet a backend's raw socket saw.
type arrival struct {
	backend  string
	src, dst netip.Addr
	pkt      sctp.Packet
	err      error // the packet did not parse (a NAT that broke its checksum)
}

// sctpBackend watches h for SCTP packets with a raw socket (the kernel has
// no SCTP sockets to listen with) and sends each to ch.
func sctpBackend(t *testing.T, h *topology.Host, ch chan<- arrival) {
	t.Helper()
	c, err := h.ListenPacket(context.Background(), "ip4:132", "0.0.0.0")
	if err != nil {
		t.Fatalf("raw SCTP socket in %s: %v", h.Name, err)
	}
	t.Cleanup(func() { c.Close() })
	p := ipv4.NewPacketConn(c)
	if err := p.SetControlMessage(ipv4.FlagDst, true); err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 1500)
		for {
			n, cm, src, err := p.ReadFrom(buf)
			if err != nil {
				return
			}
			a := arrival{backend: h.Name}
			a.src, _ = netip.AddrFromSlice(src.(*net.IPAddr).IP.To4())
			if cm != nil {
				a.dst, _ = netip.AddrFromSlice(cm.Dst.To4())
			}
			a.pkt, a.err = sctp.Parse(buf[:n])
			ch <- a
		}
	}()
}

// TestPrivilegedSCTPTraffic sends real SCTP INIT chunks through the mode's
// rules: this kernel may have no SCTP sockets (CONFIG_IP_SCTP), but
// conntrack, the sctp match and NAT handle SCTP without them, so a raw
// socket in the client sends an INIT with a correct CRC32c and raw sockets
// in the backends see where it arrives: DNATed to an endpoint's address
// and port, spread over both, masqueraded where kube-proxy masquerades,
// its checksum rewritten; a frontend without endpoints answers with ICMP
// port unreachable at once.
func TestPrivilegedSCTPTraffic(t *testing.T) {
	privileged.Require(t)
	for _, variant := range kerneltest.Variants() {
		t.Run(kerneltest.VariantName(variant), func(t *testing.T) { testSCTPTraffic(t, variant) })
	}
}

func testSCTPTraffic(t *testing.T, variant string) {
	ctx := context.Background()
	top := serviceTopology(t)
	node, client := top.Node, top.Clients[0]
	b0, b1 := top.Backends[0], top.Backends[1]

	vip := netip.AddrFrom4([4]byte{198, 19, 0, 38})
	deadVIP := netip.AddrFrom4([4]byte{198, 19, 0, 39})
	const port, targetPort, nodePort, deadNodePort = 3868, 3869, 30868, 30869
	ep := func(h *topology.Host) lb.Endpoint {
		return lb.Endpoint{Addr: netip.AddrPortFrom(h.Addr, targetPort), Ready: true, Serving: true, NodeName: nodeName}
	}
	st := store(t,
		lb.Service{Name: svcName("diameter"), Protocol: lb.SCTP, Port: port, NodePort: nodePort,
			ClusterIPs: []netip.Addr{vip}, Endpoints: []lb.Endpoint{ep(b0), ep(b1)}},
		lb.Service{Name: svcName("dead"), Protocol: lb.SCTP, Port: port, NodePort: deadNodePort, ClusterIPs: []netip.Addr{deadVIP}},
	)
	exe := &netfilter.Exec{NetNS: node.NS, Variant: variant}
	probe := "*nat\n:SVCPROXY-PROBE - [0:0]\n-A SVCPROXY-PROBE -p sctp -m sctp --dport 1 -j DNAT --to-destination 198.18.2.1:2\nCOMMIT\n" +
		"*nat\n-F SVCPROXY-PROBE\n-X SVCPROXY-PROBE\nCOMMIT\n"
	if err := exe.IPTablesRestore(ctx, netfilter.IPv4, []byte(probe)); err != nil {
		t.Skipf("this kernel cannot match or NAT SCTP (CONFIG_NETFILTER_XT_MATCH_SCTP, CONFIG_NF_CT_PROTO_SCTP): %v", err)
	}
	m, err := New(Config{Exec: exe, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, m, st.Snapshot(), true)
	t.Cleanup(func() {
		if err := m.Cleanup(ctx); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
	})

	arrivals := make(chan arrival, 64)
	for _, b := range top.Backends {
		sctpBackend(t, b, arrivals)
	}
	send := map[string]net.PacketConn{}
	for _, h := range []*topology.Host{client, node, b0} {
		c, err := h.ListenPacket(ctx, "ip4:132", "0.0.0.0")
		if err != nil {
			t.Fatalf("raw SCTP socket in %s: %v", h.Name, err)
		}
		t.Cleanup(func() { c.Close() })
		send[h.Name] = c
	}
	nextPort := uint16(40000) // a new association, so a new conntrack entry, each time

	for _, tc := range []struct {
		from string
		dst  netip.AddrPort
		peer netip.Addr // the source the backend must see
	}{
		{"client0", netip.AddrPortFrom(vip, port), client.Addr},
		{"node", netip.AddrPortFrom(vip, port), topology.NodeAddr},
		{"client0", netip.AddrPortFrom(topology.NodeAddr, nodePort), topology.NodeAddr}, // Cluster policy: masqueraded
		{"backend0", netip.AddrPortFrom(vip, port), b0.Addr},                            // hairpin: masqueraded when it reaches itself
	} {
		t.Run(fmt.Sprintf("%v from %s", tc.dst, tc.from), func(t *testing.T) {
			seen := map[string]int{}
			for range 30 {
				nextPort++
				if _, err := send[tc.from].WriteTo(sctp.Init(nextPort, tc.dst.Port(), uint32(nextPort)), &net.IPAddr{IP: tc.dst.Addr().AsSlice()}); err != nil {
					t.Fatalf("sending an INIT: %v", err)
				}
				var a arrival
				select {
				case a = <-arrivals:
				case <-time.After(2 * time.Second):
					t.Fatalf("INIT %d never reached a backend (seen %v)", nextPort, seen)
				}
				seen[a.backend]++
				backendAddr := map[string]netip.Addr{b0.Name: b0.Addr, b1.Name: b1.Addr}[a.backend]
				switch {
				case a.err != nil:
					t.Errorf("%s got a broken packet: %v", a.backend, a.err)
				case a.dst != backendAddr || a.pkt.DstPort != targetPort:
					t.Errorf("%s got it addressed to %v:%d, want %v:%d (DNAT)", a.backend, a.dst, a.pkt.DstPort, backendAddr, targetPort)
				case a.src != tc.peer && !(tc.from == a.backend && a.src == topology.NodeAddr):
					t.Errorf("%s got it from %v, want %v", a.backend, a.src, tc.peer)
				case a.pkt.Chunk != sctp.ChunkInit || a.pkt.InitiateTag != uint32(nextPort):
					t.Errorf("%s got %+v, want our INIT %d", a.backend, a.pkt, nextPort)
				}
			}
			for _, b := range top.Backends {
				if seen[b.Name] == 0 {
					t.Errorf("%s never got an INIT (%v): associations must spread over every endpoint", b.Name, seen)
				}
			}
		})
	}

	if _, err := exec.LookPath("conntrack"); err == nil {
		t.Run("conntrack tracks the associations", func(t *testing.T) {
			out, err := exec.Command("ip", "netns", "exec", node.NS, "conntrack", "-L", "-p", "sctp", "--orig-dst", vip.String()).Output()
			if err != nil {
				t.Fatalf("conntrack -L: %v", err)
			}
			// The reply tuple comes from an endpoint's address and port.
			for _, b := range top.Backends {
				if !strings.Contains(string(out), fmt.Sprintf("src=%v dst=", b.Addr)) || !strings.Contains(string(out), fmt.Sprintf("sport=%d ", targetPort)) {
					t.Errorf("no SCTP entry for %v DNATed to %v:%d:\n%s", vip, b.Addr, targetPort, out)
				}
			}
		})
	}

	// A frontend without endpoints: ICMP port unreachable, at once.
	ic, err := client.ListenPacket(ctx, "ip4:icmp", "0.0.0.0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ic.Close() })
	for _, dst := range []netip.AddrPort{netip.AddrPortFrom(deadVIP, port), netip.AddrPortFrom(topology.NodeAddr, deadNodePort)} {
		t.Run(fmt.Sprintf("no endpoints: %v refused", dst), func(t *testing.T) {
			nextPort++
			start := time.Now()
			if _, err := send[client.Name].WriteTo(sctp.Init(nextPort, dst.Port(), 1), &net.IPAddr{IP: dst.Addr().AsSlice()}); err != nil {
				t.Fatal(err)
			}
			if err := waitPortUnreachable(ic, dst, nextPort); err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took > 500*time.Millisecond {
				t.Errorf("refused after %v, want at once", took)
			}
		})
	}
	select {
	case a := <-arrivals:
		t.Errorf("%s got a packet no Service sends it: %+v", a.backend, a)
	default:
	}
}

// waitPortUnreachable reads ICMP messages from c until a port unreachable
// about an SCTP packet from srcPort to dst arrives, or 2s pass.
func waitPortUnreachable(c net.PacketConn, dst netip.AddrPort, srcPort uint16) error {
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 1500)
	for {
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("no ICMP port unreachable for %v: %w", dst, err)
		}
		msg, err := icmp.ParseMessage(1, buf[:n])
		if err != nil || msg.Type != ipv4.ICMPTypeDestinationUnreachable || msg.Code != 3 {
			continue
		}
		body, ok := msg.Body.(*icmp.DstUnreach)
		if !ok {
			continue
		}
		h, err := ipv4.ParseHeader(body.Data)
		if err != nil || h.Protocol != 132 || len(body.Data) < h.Len+4 {
			continue
		}
		quoted := body.Data[h.Len:]
		if a, _ := netip.AddrFromSlice(h.Dst.To4()); a == dst.Addr() &&
			uint16(quoted[0])<<8|uint16(quoted[1]) == srcPort && uint16(quoted[2])<<8|uint16(quoted[3]) == dst.Port() {
			return nil
		}
	}
}
