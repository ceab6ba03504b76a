// Package cases is the Service-semantics table IPVS mode is tested with:
// the same steps run against the fake kernel (through the packet tracer) and
// against a real kernel in a VM (through real sockets), so both assert the
// same behaviour.
//
// The topology both assume: a node (198.18.0.1), a client pod (198.18.1.1)
// and three backends (198.18.2.1-3), each backend serving TCP on :8080 and
// UDP on :5353 and answering with its index and the source address it saw,
// and reporting the SCTP INITs that reach it on :3869 likewise.
// Virtual IPs are in 198.19.0.0/16.
package cases

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/svcproxy/svcproxy/lb"
)

// The addresses of the topology.
var (
	NodeIP   = netip.MustParseAddr("198.18.0.1")
	PodIP    = netip.MustParseAddr("198.18.1.1")
	Backends = []netip.Addr{
		netip.MustParseAddr("198.18.2.1"),
		netip.MustParseAddr("198.18.2.2"),
		netip.MustParseAddr("198.18.2.3"),
	}
	TCPPort  uint16 = 8080 // every backend's TCP port
	UDPPort  uint16 = 5353 // every backend's UDP port
	SCTPPort uint16 = 3869 // every backend's SCTP port (the VM's guest watches it with raw sockets)

	WebClusterIP  = netip.MustParseAddrPort("198.19.0.10:80")
	WebExternalIP = netip.MustParseAddrPort("198.19.1.10:80")
	WebLBIP       = netip.MustParseAddrPort("198.19.2.10:80")
	WebNodePort   = netip.AddrPortFrom(NodeIP, 30080)
	StickyIP      = netip.MustParseAddrPort("198.19.0.11:80")
	DNSClusterIP  = netip.MustParseAddrPort("198.19.0.12:53")
	// SCTPClusterIP and SCTPNodePort are Diameter's frontends.
	SCTPClusterIP = netip.MustParseAddrPort("198.19.0.13:3868")
	SCTPNodePort  = netip.AddrPortFrom(NodeIP, 30868)
)

// Client is where a probe starts.
type Client uint8

// The clients.
const (
	Pod      Client = iota // a pod on the node
	Node                   // a process on the node itself
	Backend0               // the first backend, reaching its own Service
)

func (c Client) String() string {
	return [...]string{"pod", "node", "backend0"}[c]
}

// Outcome is what a probe must see.
type Outcome uint8

// The outcomes.
const (
	Reach   Outcome = iota // a backend answers
	Refused                // refused at once (TCP reset, ICMP port unreachable)
	// Gone: no Service takes it. The tracer says Untouched; a real client
	// fails (refused or unreachable) without reaching a backend.
	Gone
)

func (o Outcome) String() string { return [...]string{"reach", "refused", "gone"}[o] }

// Masq is what the backend must see as the source.
type Masq uint8

// The source expectations.
const (
	MasqNo   Masq = iota // the client's own address
	MasqYes              // the node's address
	MasqSelf             // the node's address exactly when the client reached itself
)

// Probe is N new connections (or UDP flows, each from its own port).
type Probe struct {
	Name     string
	From     Client
	Proto    lb.Protocol
	To       netip.AddrPort
	N        int // zero: 1
	Outcome  Outcome
	Backends []int // Reach: the backends allowed
	Balanced bool  // Reach: each allowed backend gets N/len(Backends)
	Sticky   bool  // Reach: all N land on one backend
	Masq     Masq
}

// Count is N, at least 1.
func (p Probe) Count() int { return max(p.N, 1) }

// Held is a connection (TCP) or flow (UDP) opened before a step's Services
// are applied, landing on Backend. After the apply, for TCP: it still works,
// its real server is draining (weight 0), and once it is closed the real
// server is deleted. For UDP: the real server is gone at once and the flow's
// next datagram reaches another backend.
type Held struct {
	From    Client
	Proto   lb.Protocol
	To      netip.AddrPort
	Backend int
}

// Step applies Services (the whole set) and checks the probes.
type Step struct {
	Name     string
	Services []lb.Service
	Held     *Held
	Probes   []Probe
}

func endpoints(port uint16, idx ...int) []lb.Endpoint {
	out := make([]lb.Endpoint, 0, len(idx))
	for _, i := range idx {
		out = append(out, lb.Endpoint{Addr: netip.AddrPortFrom(Backends[i], port), Ready: true, Serving: true})
	}
	return out
}

// Web is the main Service: a ClusterIP, an ExternalIP, a LoadBalancer IP
// and a NodePort, on the given backends.
func Web(idx ...int) lb.Service {
	return lb.Service{
		Name:            lb.ServicePortName{Namespace: "default", Name: "web", Port: "http"},
		Protocol:        lb.TCP,
		Port:            80,
		ClusterIPs:      []netip.Addr{WebClusterIP.Addr()},
		ExternalIPs:     []netip.Addr{WebExternalIP.Addr()},
		LoadBalancerIPs: []netip.Addr{WebLBIP.Addr()},
		NodePort:        WebNodePort.Port(),
		Endpoints:       endpoints(TCPPort, idx...),
	}
}

// Sticky has ClientIP affinity over all three backends.
func Sticky() lb.Service {
	return lb.Service{
		Name:            lb.ServicePortName{Namespace: "default", Name: "sticky", Port: "http"},
		Protocol:        lb.TCP,
		Port:            80,
		ClusterIPs:      []netip.Addr{StickyIP.Addr()},
		AffinityTimeout: 3 * time.Hour,
		Endpoints:       endpoints(TCPPort, 0, 1, 2),
	}
}

// DNS is a UDP Service.
func DNS(idx ...int) lb.Service {
	return lb.Service{
		Name:       lb.ServicePortName{Namespace: "kube-system", Name: "dns", Port: "dns"},
		Protocol:   lb.UDP,
		Port:       53,
		ClusterIPs: []netip.Addr{DNSClusterIP.Addr()},
		Endpoints:  endpoints(UDPPort, idx...),
	}
}

// Diameter is an SCTP Service with a ClusterIP and a NodePort. The VM's
// guest sends SCTP INIT chunks from raw sockets (its kernel loads no SCTP
// module) and sees which backend they reach.
func Diameter(idx ...int) lb.Service {
	return lb.Service{
		Name:       lb.ServicePortName{Namespace: "default", Name: "diameter"},
		Protocol:   lb.SCTP,
		Port:       SCTPClusterIP.Port(),
		ClusterIPs: []netip.Addr{SCTPClusterIP.Addr()},
		NodePort:   SCTPNodePort.Port(),
		Endpoints:  endpoints(SCTPPort, idx...),
	}
}

// Steps is the table, in order: each step starts from the state the one
// before left.
func Steps() []Step {
	return []Step{
		{
			Name:     "two endpoints",
			Services: []lb.Service{Web(0, 1), DNS(0, 1)},
			Probes: []Probe{
				{Name: "ClusterIP from a pod, round robin", From: Pod, To: WebClusterIP, N: 4, Backends: []int{0, 1}, Balanced: true},
				// Its source is the VIP, which every node holds: masqueraded.
				{Name: "ClusterIP from the node, masqueraded", From: Node, To: WebClusterIP, N: 2, Backends: []int{0, 1}, Balanced: true, Masq: MasqYes},
				{Name: "NodePort from a pod, masqueraded", From: Pod, To: WebNodePort, N: 2, Backends: []int{0, 1}, Balanced: true, Masq: MasqYes},
				{Name: "NodePort from the node", From: Node, To: WebNodePort, N: 2, Backends: []int{0, 1}, Balanced: true, Masq: MasqYes},
				{Name: "ExternalIP from a pod, masqueraded", From: Pod, To: WebExternalIP, N: 2, Backends: []int{0, 1}, Balanced: true, Masq: MasqYes},
				{Name: "LoadBalancer IP from a pod, masqueraded", From: Pod, To: WebLBIP, N: 2, Backends: []int{0, 1}, Balanced: true, Masq: MasqYes},
				{Name: "another port of the ClusterIP is refused", From: Pod, To: netip.AddrPortFrom(WebClusterIP.Addr(), 81), Outcome: Refused},
				{Name: "hairpin: an endpoint reaches itself through its Service", From: Backend0, To: WebClusterIP, N: 2, Backends: []int{0, 1}, Balanced: true, Masq: MasqSelf},
				{Name: "UDP ClusterIP from a pod, round robin", From: Pod, Proto: lb.UDP, To: DNSClusterIP, N: 4, Backends: []int{0, 1}, Balanced: true},
			},
		},
		{
			Name:     "session affinity",
			Services: []lb.Service{Web(0, 1), DNS(0, 1), Sticky()},
			Probes: []Probe{
				{Name: "one client sticks to one endpoint", From: Pod, To: StickyIP, N: 4, Backends: []int{0, 1, 2}, Sticky: true},
			},
		},
		{
			Name:     "an endpoint is removed: it drains",
			Services: []lb.Service{Web(0), DNS(0, 1), Sticky()},
			Held:     &Held{From: Pod, To: WebClusterIP, Backend: 1},
			Probes: []Probe{
				{Name: "ClusterIP reaches only the remaining endpoint", From: Pod, To: WebClusterIP, N: 3, Backends: []int{0}},
				{Name: "NodePort reaches only the remaining endpoint", From: Pod, To: WebNodePort, N: 2, Backends: []int{0}, Masq: MasqYes},
			},
		},
		{
			Name:     "a UDP endpoint is removed: its flows move",
			Services: []lb.Service{Web(0), DNS(0), Sticky()},
			Held:     &Held{From: Pod, Proto: lb.UDP, To: DNSClusterIP, Backend: 1},
			Probes: []Probe{
				{Name: "new UDP flows reach the remaining endpoint", From: Pod, Proto: lb.UDP, To: DNSClusterIP, N: 2, Backends: []int{0}},
			},
		},
		{
			Name:     "endpoints replaced",
			Services: []lb.Service{Web(2), DNS(0), Sticky(), Diameter(2)},
			Probes: []Probe{
				{Name: "ClusterIP reaches the new endpoint", From: Pod, To: WebClusterIP, N: 2, Backends: []int{2}},
				{Name: "ExternalIP reaches the new endpoint", From: Pod, To: WebExternalIP, N: 1, Backends: []int{2}, Masq: MasqYes},
				{Name: "SCTP ClusterIP reaches the new endpoint", From: Pod, Proto: lb.SCTP, To: SCTPClusterIP, N: 2, Backends: []int{2}},
			},
		},
		{
			Name:     "no endpoints: refused",
			Services: []lb.Service{Web(), DNS(0), Sticky()},
			Probes: []Probe{
				{Name: "ClusterIP from a pod is refused", From: Pod, To: WebClusterIP, Outcome: Refused},
				{Name: "ClusterIP from the node is refused", From: Node, To: WebClusterIP, Outcome: Refused},
				{Name: "NodePort is refused", From: Pod, To: WebNodePort, Outcome: Refused},
				{Name: "LoadBalancer IP is refused", From: Pod, To: WebLBIP, Outcome: Refused},
			},
		},
		{
			Name:     "Service removed",
			Services: []lb.Service{DNS(0), Sticky(), Diameter(0, 1)},
			Probes: []Probe{
				{Name: "its ClusterIP is gone", From: Pod, To: WebClusterIP, Outcome: Gone},
				{Name: "its NodePort is gone", From: Pod, To: WebNodePort, Outcome: Gone},
				{Name: "the other Services still work", From: Pod, To: StickyIP, N: 2, Backends: []int{0, 1, 2}, Sticky: true},
				{Name: "SCTP ClusterIP from a pod, round robin", From: Pod, Proto: lb.SCTP, To: SCTPClusterIP, N: 4, Backends: []int{0, 1}, Balanced: true},
				{Name: "SCTP NodePort from a pod, masqueraded", From: Pod, Proto: lb.SCTP, To: SCTPNodePort, N: 2, Backends: []int{0, 1}, Balanced: true, Masq: MasqYes},
				{Name: "another SCTP port of the ClusterIP is refused", From: Pod, Proto: lb.SCTP, To: netip.AddrPortFrom(SCTPClusterIP.Addr(), 3870), Outcome: Refused},
			},
		},
	}
}

// Result is what one connection of a probe saw.
type Result struct {
	Outcome Outcome
	Backend int        // Reach: the backend's index
	Src     netip.Addr // Reach: the source address the backend saw
	Client  netip.Addr // the client's own source address
	Detail  string     // how it failed, for messages
}

// ClientIndex is the backend index a client is, or -1.
func (c Client) ClientIndex() int {
	if c == Backend0 {
		return 0
	}
	return -1
}

// Check returns what is wrong with results for p, or "".
func Check(p Probe, results []Result) string {
	counts := map[int]int{}
	for i, r := range results {
		if r.Outcome != p.Outcome {
			return fmt.Sprintf("connection %d: %v (%s), want %v", i, r.Outcome, r.Detail, p.Outcome)
		}
		if r.Outcome != Reach {
			continue
		}
		if !slices.Contains(p.Backends, r.Backend) {
			return fmt.Sprintf("connection %d reached backend%d, want one of %v", i, r.Backend, p.Backends)
		}
		counts[r.Backend]++
		wantNode := p.Masq == MasqYes || (p.Masq == MasqSelf && r.Backend == p.From.ClientIndex())
		switch {
		case wantNode && r.Src != NodeIP:
			return fmt.Sprintf("connection %d: backend%d saw source %v, want the node's %v (masqueraded)", i, r.Backend, r.Src, NodeIP)
		case !wantNode && r.Src != r.Client:
			return fmt.Sprintf("connection %d: backend%d saw source %v, want the client's %v (not masqueraded)", i, r.Backend, r.Src, r.Client)
		}
	}
	if p.Outcome != Reach {
		return ""
	}
	if p.Balanced {
		for _, b := range p.Backends {
			if counts[b] != len(results)/len(p.Backends) {
				return fmt.Sprintf("not balanced: connections per backend %v, want %d each of %v", counts, len(results)/len(p.Backends), p.Backends)
			}
		}
	}
	if p.Sticky && len(counts) != 1 {
		return fmt.Sprintf("not sticky: connections per backend %v", counts)
	}
	return ""
}
