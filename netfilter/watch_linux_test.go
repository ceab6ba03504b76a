package netfilter

import (
	"context"
	"os/exec"
	"testing"
	"time"
)

// TestPrivilegedWatchRuleset: a change to a watched table made by another
// process is reported within a second; one to another table, or made by
// this process's own Exec, is not.
func TestPrivilegedWatchRuleset(t *testing.T) {
	privileged.Require(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skipf("needs nft on PATH (apt-get install nftables): %v", err)
	}
	ns := privileged.NewNS(t)
	e := NewExec(ns)
	e.Variant = "nft"
	ctx := context.Background()
	// Our own chain, as a mode would write it.
	if err := e.IPTablesRestore(ctx, IPv4, []byte("*nat\n:SVCPROXY-TEST - [0:0]\n-A SVCPROXY-TEST -j RETURN\n-A PREROUTING -j SVCPROXY-TEST\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		change func() error
		want   bool
	}{
		{"iptables-nft flushes a watched chain", func() error {
			return run(ns, "iptables-nft", "-t", "nat", "-F", "SVCPROXY-TEST")
		}, true},
		{"iptables-nft deletes the jump", func() error {
			return run(ns, "iptables-nft", "-t", "nat", "-D", "PREROUTING", "-j", "SVCPROXY-TEST")
		}, true},
		{"nft deletes the whole table", func() error { return run(ns, "nft", "delete", "table", "ip", "nat") }, true},
		{"our own restore", func() error {
			return e.IPTablesRestore(ctx, IPv4, []byte("*nat\n:SVCPROXY-TEST - [0:0]\n-A SVCPROXY-TEST -j RETURN\nCOMMIT\n"))
		}, false},
		{"another table", func() error {
			if err := run(ns, "nft", "add", "table", "inet", "other"); err != nil {
				return err
			}
			return run(ns, "nft", "add", "chain", "inet", "other", "c")
		}, false},
		{"the other family's nat", func() error {
			return run(ns, "ip6tables-nft", "-t", "nat", "-A", "PREROUTING", "-j", "ACCEPT")
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			got := make(chan struct{}, 16)
			cfg := WatchConfig{NetNS: ns, Own: e.Spawned, Tables: []Table{{IPv4, "nat"}, {IPv4, "filter"}}}
			if err := WatchRuleset(ctx, cfg, func() { got <- struct{}{} }); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if err := tc.change(); err != nil {
				t.Fatal(err)
			}
			wait := 300 * time.Millisecond
			if tc.want {
				wait = time.Second
			}
			select {
			case <-got:
				if !tc.want {
					t.Fatal("reported, want no report")
				}
				t.Logf("reported after %v", time.Since(start).Round(time.Millisecond))
			case <-time.After(wait):
				if tc.want {
					t.Fatalf("not reported within %v", wait)
				}
			}
		})
	}
}

func run(ns string, args ...string) error {
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
	if err != nil {
		return &toolError{tool: args, err: err, stderr: string(out)}
	}
	return nil
}

// FuzzWatchMessages: whatever the netlink socket delivers, reading it
// never panics, and a report comes only at the end of a transaction.
func FuzzWatchMessages(f *testing.F) {
	// A NEWRULE for table nat then a NEWGEN from pid 7, as the kernel sends them.
	msg := func(typ uint16, attrs ...[]byte) []byte {
		body := []byte{2, 0, 0, 0} // nfgenmsg: NFPROTO_IPV4
		for _, a := range attrs {
			body = append(body, a...)
		}
		b := make([]byte, 16, 16+len(body))
		b = append(b, body...)
		putU32 := func(o int, v uint32) { b[o], b[o+1], b[o+2], b[o+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24) }
		putU32(0, uint32(len(b)))
		b[4], b[5] = byte(typ), byte(typ>>8)
		return b
	}
	nla := func(typ uint16, v []byte) []byte {
		l := 4 + len(v)
		b := append([]byte{byte(l), byte(l >> 8), byte(typ), byte(typ >> 8)}, v...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	rule := msg(0x0a<<8|6, nla(1, []byte("nat\x00")))
	gen := msg(0x0a<<8|15, nla(1, []byte{0, 0, 0, 1}), nla(2, []byte{0, 0, 0, 7}))
	f.Add(append(append([]byte{}, rule...), gen...))
	f.Add(gen)
	f.Add(rule[:10])
	f.Fuzz(func(t *testing.T, b []byte) {
		reports := 0
		w := &watch{cfg: WatchConfig{Tables: []Table{{IPv4, "nat"}}}, changed: func() { reports++ }}
		w.messages(b)
		if reports > 0 && len(b) < 2*16 {
			t.Fatalf("%d reports from %d bytes: a transaction takes at least two messages", reports, len(b))
		}
	})
}
