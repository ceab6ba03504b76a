package ipvs_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs/internal/cases"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs/ipvstest"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
)

// TestPrivilegedRulesInNamespace writes the IPVS mode's sets and rules with
// the real iptables (the node's default backend and legacy) and ipset, in a
// network namespace it creates, with the fake IPVS and links (this machine
// has neither IPVS nor dummy interfaces; the VM test covers those). It
// checks the tools accept every line, that what iptables-save and ipset save
// print reads back as what was written (a full sync finds nothing to
// repair), that tampering is repaired, and that Cleanup leaves other rules
// alone.
func TestPrivilegedRulesInNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: run as root (it only touches a network namespace it creates)")
	}
	for _, tool := range []string{"ip", "iptables-restore", "iptables-save", "ipset"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (apt-get install iproute2 iptables ipset)", tool)
		}
	}
	variants := []string{""}
	if _, err := exec.LookPath("iptables-legacy-restore"); err == nil {
		variants = append(variants, "legacy")
	}
	for _, variant := range variants {
		name := variant
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			ns := newNamespace(t)
			e := &netfilter.Exec{NetNS: ns, Variant: variant}
			foreign := "*nat\n:FOREIGN - [0:0]\n-A PREROUTING -j FOREIGN\n-A POSTROUTING -o eth9 -j MASQUERADE\nCOMMIT\n*filter\n-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\nCOMMIT\n"
			if err := e.IPTablesRestore(ctx, ipvs.IPv4, []byte(foreign)); err != nil {
				t.Fatal(err)
			}
			if err := e.IPSetRestore(ctx, []byte("create foreign hash:ip family inet\nadd foreign 10.1.2.3\n")); err != nil {
				t.Fatal(err)
			}
			before := rulesState(t, e)

			f := ipvstest.NewFakes(nil)
			w := newWorldOn(t, f, &fakeClock{}, ipvs.Config{NodeIPs: []netip.Addr{cases.NodeIP}, Rules: e})
			svcs := []lb.Service{cases.Web(0, 1), cases.DNS(0, 1), cases.Sticky(), cases.Diameter(0, 1)}
			w.apply(true, svcs...)
			applied := rulesState(t, e)
			for _, want := range []string{":SVCPROXY-IPVS-SERVICES", "-A PREROUTING -j SVCPROXY-IPVS-SERVICES", "-A INPUT -j SVCPROXY-IPVS-FILTER",
				"add svcproxy-ipvs-vs-v4 198.19.0.10,tcp:80", "add svcproxy-ipvs-loop-v4 198.18.2.1,tcp:8080,198.18.2.1", "add svcproxy-ipvs-np-masq-tcp 30080",
				"add svcproxy-ipvs-vs-v4 198.19.0.13,sctp:3868", "add svcproxy-ipvs-np-masq-sctp-v4 198.18.0.1,sctp:30868",
				"-A SVCPROXY-IPVS-NODEPORTS -p sctp -m set --match-set svcproxy-ipvs-np-masq-sctp-v4 dst,dst -j SVCPROXY-IPVS-MARK-MASQ"} {
				if !strings.Contains(applied, want) {
					t.Errorf("after Apply, no %q in:\n%s", want, applied)
				}
			}
			w.apply(true, svcs...)
			if w.m.Repairs() != 0 {
				t.Fatalf("a full sync of what it just wrote counted %d repairs: iptables-save or ipset save does not read back as written", w.m.Repairs())
			}
			// Incremental changes are set members only.
			w.apply(false, cases.Web(0), cases.Sticky())
			w.apply(true, cases.Web(0), cases.Sticky())
			if w.m.Repairs() != 0 {
				t.Errorf("a full sync after incremental ones counted %d repairs", w.m.Repairs())
			}
			w.apply(false, svcs...)
			if got := rulesState(t, e); got != applied {
				t.Errorf("after changing back:\n%s\nwant:\n%s", got, applied)
			}

			tamper := "*nat\n-D PREROUTING -j SVCPROXY-IPVS-SERVICES\n-A SVCPROXY-IPVS-MARK-MASQ -j RETURN\n:SVCPROXY-IPVS-JUNK - [0:0]\nCOMMIT\n"
			if err := e.IPTablesRestore(ctx, ipvs.IPv4, []byte(tamper)); err != nil {
				t.Fatal(err)
			}
			if err := e.IPSetRestore(ctx, []byte("del svcproxy-ipvs-vs-v4 198.19.0.10,tcp:80\ncreate svcproxy-ipvs-junk hash:ip family inet\n")); err != nil {
				t.Fatal(err)
			}
			w.apply(true, svcs...)
			if w.m.Repairs() != 1 {
				t.Errorf("Repairs() = %d after tampering, want 1", w.m.Repairs())
			}
			if got := rulesState(t, e); got != applied {
				t.Errorf("after the repair:\n%s\nwant:\n%s", got, applied)
			}

			if err := w.m.Cleanup(ctx); err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			if got := rulesState(t, e); got != before {
				t.Errorf("after Cleanup:\n%s\nwant what was there before:\n%s", got, before)
			}
		})
	}
}

func newNamespace(t *testing.T) string {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	name := "svcproxy-ipvs-test-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Skipf("cannot create a network namespace: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("deleting namespace %s: %v: %s", name, err, out)
		}
	})
	return name
}

// rulesState is iptables-save (without counters and comments) and ipset
// save of the namespace, sorted within each table.
func rulesState(t *testing.T, e *netfilter.Exec) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	for _, tbl := range []string{"nat", "filter"} {
		out, err := e.IPTablesSave(ctx, ipvs.IPv4, tbl)
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(out)) {
			if strings.HasPrefix(line, "#") {
				continue
			}
			if strings.HasPrefix(line, ":") {
				line = strings.Fields(line)[0] + "\n"
			}
			b.WriteString(line)
		}
	}
	out, err := e.IPSetSave(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for i, l := range lines {
		// A recreated set gets a new random hash seed.
		if j := strings.Index(l, " initval "); j >= 0 {
			lines[i] = l[:j]
		}
	}
	slices.Sort(lines) // hash sets list members in no particular order
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	return b.String()
}
