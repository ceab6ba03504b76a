package e2e

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/internal/proctest"
)

// TestPrivilegedTamperingRepaired: someone flushes svcproxy's nat chain
// (userspace mode), destroys its ipsets' members, or flushes the DNAT
// dispatch chain (iptables mode). With iptables on nf_tables svcproxy hears
// of a rule change as it happens and repairs it within a second or two,
// long before its (here: one minute) periodic full sync; ipset, and
// iptables-legacy, make no notifications: there the periodic sync (here
// every 2 s) repairs. Either way a repair is counted.
func TestPrivilegedTamperingRepaired(t *testing.T) {
	out, _ := exec.Command("iptables", "--version").Output()
	nft := strings.Contains(string(out), "nf_tables")
	for _, tc := range []struct {
		name     string
		args     []string
		tamper   []string
		metric   string
		notified bool // a change nf_tables notifications report
	}{
		{"userspace chain flushed", nil, []string{"iptables", "-t", "nat", "-F", "SVCPROXY-SERVICES"}, "svcproxy_redirect_repairs_total", nft},
		{"userspace set flushed", nil, []string{"ipset", "flush", "svcproxy-svc-v4"}, "svcproxy_redirect_repairs_total", false},
		{"iptables chain flushed", []string{"--proxy-mode=iptables"}, []string{"iptables", "-t", "nat", "-F", "SVCPROXY-DNAT-SERVICES"}, "svcproxy_iptables_repairs_total", nft},
	} {
		t.Run(tc.name, func(t *testing.T) {
			notified := tc.notified
			period, within := "--sync-period=2s", 10*time.Second
			if notified {
				period, within = "--sync-period=60s", 3*time.Second
			}
			c := newCluster(t, 2, "", append([]string{period}, tc.args...)...)
			client := c.topo.Clients[0]
			if _, err := c.get(client, webVIP+":80"); err != nil {
				t.Fatalf("the ClusterIP fails before any tampering: %v", err)
			}
			if out, err := c.topo.Node.Command(context.Background(), tc.tamper[0], tc.tamper[1:]...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %v: %s", tc.tamper, err, out)
			}
			start := time.Now()
			failed := 0 // SYNs that met no rule: their conntrack entries are cleared after the repair
			if _, err := c.get(client, webVIP+":80"); err == nil && !notified {
				t.Fatal("the ClusterIP still works right after its rules were flushed: the test tampers with nothing")
			} else if err != nil {
				failed++
			}
			deadline := start.Add(within)
			for {
				if _, err := c.get(client, webVIP+":80"); err == nil {
					break
				}
				failed++
				if time.Now().After(deadline) {
					t.Fatalf("the ClusterIP still fails %v after tampering (%s, nf_tables notifications %v)", within, period, notified)
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Logf("repaired %v after tampering (%s, nf_tables notifications %v)", time.Since(start).Round(10*time.Millisecond), period, notified)
			waitFor := time.Now().Add(within)
			for c.metric(t, tc.metric) < 1 && time.Now().Before(waitFor) {
				time.Sleep(100 * time.Millisecond)
			}
			if n := c.metric(t, tc.metric); n < 1 {
				t.Errorf("%s = %v, want at least 1", tc.metric, n)
			}
			const cleared = "svcproxy_conntrack_unserved_entries_deleted_total"
			for failed > 0 && c.metric(t, cleared) < 1 && time.Now().Before(waitFor) {
				time.Sleep(100 * time.Millisecond)
			}
			if n := c.metric(t, cleared); failed > 0 && n < 1 {
				t.Errorf("%s = %v after %d connections met no rule, want at least 1: the repair clears their entries", cleared, n, failed)
			}
			// kube-proxy's counter holds those and whatever else a sync
			// deleted.
			const all = `kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"}`
			samples := proctest.Scrape(t, c.topo.Node.Dial, "http://127.0.0.1:10249/metrics")
			if !slices.ContainsFunc(samples, func(l string) bool { return strings.HasPrefix(l, all+" ") }) {
				t.Errorf("%s is not exported", all)
			} else if n, unserved := samples.Value(all), samples.Value(cleared); n < unserved {
				t.Errorf("%s = %v, less than %s = %v", all, n, cleared, unserved)
			}
			if notified {
				if n := c.metric(t, "svcproxy_rules_changed_by_others_total"); n < 1 {
					t.Errorf("svcproxy_rules_changed_by_others_total = %v, want at least 1", n)
				}
			}
		})
	}
}
