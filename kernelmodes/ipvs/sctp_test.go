package ipvs_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs/internal/cases"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs/ipvstest"
	"github.com/svcproxy/svcproxy/lb"
)

// TestSCTP runs SCTP Services through the fakes' tracer, as kube-proxy's
// IPVS mode serves them: SCTP virtual servers for the ClusterIP and each
// node IP's NodePort, NodePorts masqueraded and rejected through
// nodeIP,sctp:port members (the kernel's bitmap:port never matches SCTP),
// a removed real server deleted at once, and a full sync that reads the
// SCTP virtual servers back without seeing tampering. This kernel has no
// IPVS; the shared case table's SCTP probes run against a real one in the
// VM test (TestPrivilegedIPVSInVM).
func TestSCTP(t *testing.T) {
	vip := netip.MustParseAddrPort("198.19.0.38:3868")
	deadVIP := netip.MustParseAddrPort("198.19.0.39:3868")
	nodePort := netip.AddrPortFrom(cases.NodeIP, 30868)
	deadNodePort := netip.AddrPortFrom(cases.NodeIP, 30869)
	diameter := func(idx ...int) lb.Service {
		s := lb.Service{
			Name:       lb.ServicePortName{Namespace: "default", Name: "diameter"},
			Protocol:   lb.SCTP,
			Port:       vip.Port(),
			ClusterIPs: []netip.Addr{vip.Addr()},
			NodePort:   nodePort.Port(),
		}
		for _, i := range idx {
			s.Endpoints = append(s.Endpoints, lb.Endpoint{Addr: netip.AddrPortFrom(cases.Backends[i], 3869), Ready: true, Serving: true})
		}
		return s
	}
	dead := lb.Service{
		Name: lb.ServicePortName{Namespace: "default", Name: "dead"}, Protocol: lb.SCTP, Port: deadVIP.Port(),
		ClusterIPs: []netip.Addr{deadVIP.Addr()}, NodePort: deadNodePort.Port(),
	}

	for _, full := range []bool{false, true} {
		t.Run(map[bool]string{false: "incremental", true: "full"}[full], func(t *testing.T) {
			w := newWorld(t, ipvs.Config{})
			w.apply(full, diameter(0, 1), dead, cases.Web(0))

			sctpOnly := func(v ipvstest.VirtualServer) bool { return v.Protocol == lb.SCTP }
			checkVirtualServers(t, virtualServers(w.f, sctpOnly), []string{
				"sctp 198.18.0.1:30868 rr -> 198.18.2.1:3869 w1 -> 198.18.2.2:3869 w1",
				"sctp 198.18.0.1:30869 rr",
				"sctp 198.19.0.38:3868 rr -> 198.18.2.1:3869 w1 -> 198.18.2.2:3869 w1",
				"sctp 198.19.0.39:3868 rr",
			})
			for _, m := range []string{
				"add svcproxy-ipvs-np-masq-sctp-v4 198.18.0.1,sctp:30868",
				"add svcproxy-ipvs-np-masq-sctp-v4 198.18.0.1,sctp:30869",
				"add svcproxy-ipvs-np-rej-sctp-v4 198.18.0.1,sctp:30869",
				"add svcproxy-ipvs-reject-v4 198.19.0.39,sctp:3868",
			} {
				if !strings.Contains(w.f.Rules.Dump(), m+"\n") {
					t.Errorf("no member %q in:\n%s", m, w.f.Rules.Dump())
				}
			}

			for _, p := range []cases.Probe{
				{Name: "ClusterIP from a pod", From: cases.Pod, Proto: lb.SCTP, To: vip, N: 4, Backends: []int{0, 1}, Balanced: true},
				{Name: "ClusterIP from the node, masqueraded", From: cases.Node, Proto: lb.SCTP, To: vip, N: 2, Backends: []int{0, 1}, Balanced: true, Masq: cases.MasqYes},
				{Name: "NodePort, masqueraded", From: cases.Pod, Proto: lb.SCTP, To: nodePort, N: 2, Backends: []int{0, 1}, Balanced: true, Masq: cases.MasqYes},
				{Name: "hairpin", From: cases.Backend0, Proto: lb.SCTP, To: vip, N: 2, Backends: []int{0, 1}, Balanced: true, Masq: cases.MasqSelf},
				{Name: "ClusterIP without endpoints refused", From: cases.Pod, Proto: lb.SCTP, To: deadVIP, Outcome: cases.Refused},
				{Name: "NodePort without endpoints refused", From: cases.Pod, Proto: lb.SCTP, To: deadNodePort, Outcome: cases.Refused},
				{Name: "another port of the ClusterIP refused", From: cases.Pod, Proto: lb.SCTP, To: netip.AddrPortFrom(vip.Addr(), 3870), Outcome: cases.Refused},
				{Name: "TCP to the SCTP ClusterIP refused", From: cases.Pod, Proto: lb.TCP, To: vip, Outcome: cases.Refused},
				{Name: "SCTP to a TCP ClusterIP refused", From: cases.Pod, Proto: lb.SCTP, To: cases.WebClusterIP, Outcome: cases.Refused},
				{Name: "TCP NodePort of the same number not served", From: cases.Pod, Proto: lb.TCP, To: nodePort, Outcome: cases.Gone},
			} {
				if msg := cases.Check(p, w.probe(p)); msg != "" {
					t.Errorf("%s: %s", p.Name, msg)
				}
			}

			// An endpoint removed, with an association open on it: its
			// real server goes at once (no draining, as kube-proxy).
			var held *ipvstest.Conn
			for range 10 {
				if c := w.f.Connect(w.packet(cases.Pod, lb.SCTP, vip)); c.Route.Backend.Addr() == cases.Backends[1] {
					held = c
					break
				}
			}
			if held == nil {
				t.Fatal("no association reached backend1")
			}
			defer held.Close()
			w.apply(full, diameter(0), dead, cases.Web(0))
			if rs := w.realServers(lb.SCTP, vip); !slices.Equal(rs, []string{"198.18.2.1:3869 w1"}) {
				t.Errorf("real servers after the removal: %v, want only 198.18.2.1:3869 (no draining)", rs)
			}
			if n := w.m.Draining(); n != 0 {
				t.Errorf("Draining() = %d, want 0", n)
			}
			// A full sync reads the SCTP virtual servers back as its own.
			w.apply(true, diameter(0), dead, cases.Web(0))
			w.apply(true, diameter(0), dead, cases.Web(0))
			if n := w.m.Repairs(); n != 0 {
				t.Errorf("Repairs() = %d after unchanged full syncs, want 0", n)
			}
		})
	}
}
