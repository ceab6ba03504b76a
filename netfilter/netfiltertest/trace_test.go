package netfiltertest

import (
	"context"
	"math"
	"net/netip"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/lb"

	"github.com/svcproxy/svcproxy/netfilter"
)

// dnatRules is a small kube-proxy-shaped nat table: a ClusterIP spread over
// three endpoints, one with affinity, masquerade of marked traffic and of
// hairpin connections.
const dnatRules = `*nat
:SVC - [0:0]
:SPREAD - [0:0]
:STICKY - [0:0]
:EP1 - [0:0]
:EP2 - [0:0]
:POST - [0:0]
-A PREROUTING -j SVC
-A OUTPUT -j SVC
-A POSTROUTING -j POST
-A SVC -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j SPREAD
-A SVC -d 10.96.0.2/32 -p tcp -m tcp --dport 80 -j STICKY
-A SPREAD ! -s 10.244.0.0/16 -j MARK --set-xmark 0x4000/0x4000
-A SPREAD -p tcp -m statistic --mode random --probability 0.33333333349 -j DNAT --to-destination 10.244.0.1:8080
-A SPREAD -p tcp -m statistic --mode random --probability 0.50000000000 -j DNAT --to-destination 10.244.0.2:8080
-A SPREAD -p tcp -j DNAT --to-destination 10.244.0.3:8080
-A STICKY -m recent --rcheck --seconds 60 --reap --name EP1 --mask 255.255.255.255 --rsource -j EP1
-A STICKY -m recent --rcheck --seconds 60 --reap --name EP2 --mask 255.255.255.255 --rsource -j EP2
-A STICKY -p tcp -m statistic --mode random --probability 0.50000000000 -j EP1
-A STICKY -j EP2
-A EP1 -p tcp -m recent --set --name EP1 --mask 255.255.255.255 --rsource -j DNAT --to-destination 10.244.0.1:8080
-A EP2 -p tcp -m recent --set --name EP2 --mask 255.255.255.255 --rsource -j DNAT --to-destination 10.244.0.2:8080
-A POST -m conntrack --ctstate DNAT -m set --match-set hairpin dst,dst,src -j MASQUERADE --random-fully
-A POST -m mark ! --mark 0x4000/0x4000 -j RETURN
-A POST -j MARK --set-xmark 0x4000/0x0
-A POST -j MASQUERADE --random-fully
COMMIT
`

func newDNATFake(t *testing.T) *Fake {
	t.Helper()
	f := NewFake()
	ctx := context.Background()
	if err := f.IPSetRestore(ctx, []byte("create hairpin hash:ip,port,ip family inet\nadd hairpin 10.244.0.1,tcp:8080,10.244.0.1\nadd hairpin 10.244.0.2,tcp:8080,10.244.0.2\nadd hairpin 10.244.0.3,tcp:8080,10.244.0.3\n")); err != nil {
		t.Fatal(err)
	}
	if err := f.IPTablesRestore(ctx, netfilter.IPv4, []byte(dnatRules)); err != nil {
		t.Fatal(err)
	}
	return f
}

func dnatTo(dst string, masq bool) Verdict {
	return Verdict{Action: DNAT, Dst: ap(dst), Masquerade: masq}
}

func TestTraceAllSpread(t *testing.T) {
	f := newDNATFake(t)
	p := pkt(lb.TCP, "10.96.0.1:80", Prerouting)
	got := f.TraceAll(p)
	want := []string{"10.244.0.1:8080", "10.244.0.2:8080", "10.244.0.3:8080"}
	if len(got) != len(want) {
		t.Fatalf("TraceAll = %v, want %d outcomes", got, len(want))
	}
	for i, o := range got {
		if !sameVerdict(o.Verdict, dnatTo(want[i], false)) || math.Abs(o.Probability-1.0/3) > 1e-6 {
			t.Errorf("outcome %d = %v p=%v, want %v p=1/3", i, o.Verdict, o.Probability, want[i])
		}
	}
	// From the node (outside the pod range): marked, so masqueraded.
	for _, o := range f.TraceAll(pkt(lb.TCP, "10.96.0.1:80", Output)) {
		if o.Action != DNAT || !o.Masquerade {
			t.Errorf("from the node: %v, want a masqueraded DNAT", o.Verdict)
		}
	}
	// Trace picks one; over many connections every endpoint gets some.
	seen := map[netip.AddrPort]int{}
	for range 300 {
		v := f.Trace(p)
		if v.Action != DNAT {
			t.Fatalf("Trace = %v", v)
		}
		seen[v.Dst]++
	}
	for _, w := range want {
		if n := seen[ap(w)]; n < 60 {
			t.Errorf("%s got %d of 300 connections", w, n)
		}
	}
}

func TestTraceHairpin(t *testing.T) {
	f := newDNATFake(t)
	p := pkt(lb.TCP, "10.96.0.1:80", Prerouting)
	p.Src = ap("10.244.0.2:40000") // an endpoint reaching its own Service
	for _, o := range f.TraceAll(p) {
		self := o.Dst.Addr() == p.Src.Addr()
		if o.Masquerade != self {
			t.Errorf("%v: masquerade = %v, want %v (only when it reaches itself)", o.Verdict, o.Masquerade, self)
		}
	}
}

func TestTraceRecentAffinity(t *testing.T) {
	f := newDNATFake(t)
	p := pkt(lb.TCP, "10.96.0.2:80", Prerouting)
	if got := f.TraceAll(p); len(got) != 2 {
		t.Fatalf("before any connection: %v, want both endpoints", got)
	}
	first := f.Trace(p)
	for range 20 {
		if v := f.Trace(p); v.Dst != first.Dst {
			t.Fatalf("affinity broken: %v then %v", first, v)
		}
	}
	if got := f.TraceAll(p); len(got) != 1 || got[0].Dst != first.Dst || got[0].Probability != 1 {
		t.Errorf("TraceAll with affinity = %v, want only %v", got, first.Dst)
	}
	other := p
	other.Src = ap("10.244.9.9:1234")
	if got := f.TraceAll(other); len(got) != 2 {
		t.Errorf("another client: %v, want both endpoints", got)
	}
	f.Advance(61 * time.Second)
	if got := f.TraceAll(p); len(got) != 2 {
		t.Errorf("after the timeout: %v, want both endpoints again", got)
	}
}

func TestTraceFilterAfterDNAT(t *testing.T) {
	f := newDNATFake(t)
	ctx := context.Background()
	// A DROP policy on FORWARD stops forwarded DNAT traffic but not the
	// node's own.
	if err := f.IPTablesRestore(ctx, netfilter.IPv4, []byte("*filter\n:FORWARD DROP [0:0]\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	checkTrace(t, f, pkt(lb.TCP, "10.96.0.1:80", Prerouting), Verdict{Action: Drop})
	if v := f.Trace(pkt(lb.TCP, "10.96.0.1:80", Output)); v.Action != DNAT {
		t.Errorf("from the node: %v, want DNAT", v)
	}
	if err := f.IPTablesRestore(ctx, netfilter.IPv4, []byte("*filter\n-A FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	p := pkt(lb.TCP, "10.96.0.1:80", Prerouting)
	p.Src = ap("192.0.2.99:5555") // off-cluster: marked
	if v := f.Trace(p); v.Action != DNAT || !v.Masquerade {
		t.Errorf("marked forwarded traffic: %v, want a masqueraded DNAT", v)
	}
}

// TestTraceSCTP checks protocol matching for SCTP as the kernel does it:
// -p sctp -m sctp --dport matches only SCTP, a hash:ip,port member names
// its protocol, and bitmap:port never matches an SCTP packet (the kernel's
// ip_set_get_ip_port reads TCP and UDP ports only; checked against the
// kernel in TestPrivilegedSCTPMatches).
func TestTraceSCTP(t *testing.T) {
	f := NewFake()
	ctx := context.Background()
	if err := f.IPSetRestore(ctx, []byte("create vips hash:ip,port family inet\nadd vips 10.96.0.5,sctp:3868\n"+
		"create ports bitmap:port range 0-65535\nadd ports 30868\n")); err != nil {
		t.Fatal(err)
	}
	if err := f.IPTablesRestore(ctx, netfilter.IPv4, []byte(`*nat
-A PREROUTING -d 10.96.0.3/32 -p sctp -m sctp --dport 3868 -j DNAT --to-destination 10.244.0.3:3868
-A PREROUTING -d 10.96.0.4/32 -p tcp -m tcp --dport 3868 -j DNAT --to-destination 10.244.0.4:3868
-A PREROUTING -m set --match-set vips dst,dst -j DNAT --to-destination 10.244.0.5
-A PREROUTING -m set --match-set ports dst -j DNAT --to-destination 10.244.0.6
COMMIT
`)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		proto lb.Protocol
		dst   string
		want  Verdict
	}{
		{lb.SCTP, "10.96.0.3:3868", dnatTo("10.244.0.3:3868", false)},
		{lb.TCP, "10.96.0.3:3868", Verdict{Action: Accept}},
		{lb.SCTP, "10.96.0.4:3868", Verdict{Action: Accept}},
		{lb.SCTP, "10.96.0.5:3868", dnatTo("10.244.0.5:3868", false)},
		{lb.TCP, "10.96.0.5:3868", Verdict{Action: Accept}},
		{lb.UDP, "10.96.0.9:30868", dnatTo("10.244.0.6:30868", false)},
		{lb.SCTP, "10.96.0.9:30868", Verdict{Action: Accept}},
	} {
		if got := f.Trace(pkt(tc.proto, tc.dst, Prerouting)); !sameVerdict(got, tc.want) {
			t.Errorf("%v to %s: %v, want %v", tc.proto, tc.dst, got, tc.want)
		}
	}
}

// TestTraceChain walks single chains, as the IPVS mode's tracer does around
// IPVS: the mark a nat chain sets is carried into the next chain by the
// caller, hash:ip sets match the destination address, and a chain that runs
// out decides nothing.
func TestTraceChain(t *testing.T) {
	f := NewFake()
	ctx := context.Background()
	if err := f.IPSetRestore(ctx, []byte("create vips hash:ip family inet\nadd vips 10.96.0.1\n")); err != nil {
		t.Fatal(err)
	}
	rules := "*nat\n:MARKVIP - [0:0]\n-A PREROUTING -j MARKVIP\n-A MARKVIP -m set --match-set vips dst -j MARK --or-mark 0x4000\n" +
		":POST - [0:0]\n-A POSTROUTING -j POST\n-A POST -m mark ! --mark 0x4000/0x4000 -j RETURN\n-A POST -j MASQUERADE\nCOMMIT\n" +
		"*filter\n-A INPUT -p tcp -m set --match-set vips dst -m tcp --dport 81 -j REJECT --reject-with tcp-reset\nCOMMIT\n"
	if err := f.IPTablesRestore(ctx, netfilter.IPv4, []byte(rules)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dst      string
		wantMark uint32
		reject   bool
		masq     bool
	}{
		{"10.96.0.1:80", 0x4000, false, true},
		{"10.96.0.1:81", 0x4000, true, true},
		{"10.96.0.2:81", 0, false, false},
	} {
		p := pkt(lb.TCP, tc.dst, Prerouting)
		v, mark, decided := f.TraceChain(p, "nat", "PREROUTING")
		if decided || mark != tc.wantMark {
			t.Errorf("%s nat PREROUTING: %v decided %v mark %#x, want undecided, mark %#x", tc.dst, v, decided, mark, tc.wantMark)
		}
		v, _, decided = f.TraceChain(p, "filter", "INPUT")
		if got := decided && v.Action == Reject; got != tc.reject {
			t.Errorf("%s filter INPUT: %v (decided %v), want rejected %v", tc.dst, v, decided, tc.reject)
		}
		p.Mark = mark
		v, _, _ = f.TraceChain(p, "nat", "POSTROUTING")
		if v.Masquerade != tc.masq {
			t.Errorf("%s nat POSTROUTING with mark %#x: %v, want masquerade %v", tc.dst, mark, v, tc.masq)
		}
	}
	if v, mark, decided := f.TraceChain(pkt(lb.TCP, "10.96.0.1:80", Prerouting), "mangle", "PREROUTING"); decided || mark != 0 || v.Action != Accept {
		t.Errorf("a table the Fake does not hold: %v %#x %v", v, mark, decided)
	}
	out, err := f.IPSetSave(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := "create vips hash:ip family inet maxelem 65536\nadd vips 10.96.0.1\n"; string(out) != want {
		t.Errorf("IPSetSave:\n%s\nwant:\n%s", out, want)
	}
	if n := f.CountCalls("ipset-save"); n != 1 {
		t.Errorf("%d ipset-save calls recorded, want 1", n)
	}
}
