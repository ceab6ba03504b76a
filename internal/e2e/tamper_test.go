package e2e

import (
	"context"
	"testing"
	"time"
)

// TestPrivilegedTamperingRepaired: someone flushes svcproxy's nat chain
// and destroys its ipsets' members (userspace mode), or flushes the DNAT
// dispatch chain (iptables mode); the sync every --sync-period notices and
// puts them back, and counts a repair.
func TestPrivilegedTamperingRepaired(t *testing.T) {
	for _, tc := range []struct {
		mode   string
		args   []string
		tamper [][]string
		metric string
	}{
		{"userspace", nil, [][]string{
			{"iptables", "-t", "nat", "-F", "SVCPROXY-SERVICES"},
			{"ipset", "flush", "svcproxy-svc-v4"},
		}, "svcproxy_redirect_repairs_total"},
		{"iptables", []string{"--proxy-mode=iptables"}, [][]string{
			{"iptables", "-t", "nat", "-F", "SVCPROXY-DNAT-SERVICES"},
		}, "svcproxy_iptables_repairs_total"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			c := newCluster(t, 2, "", append([]string{"--sync-period=2s"}, tc.args...)...)
			client := c.topo.Clients[0]
			if _, err := c.get(client, webVIP+":80"); err != nil {
				t.Fatalf("the ClusterIP fails before any tampering: %v", err)
			}
			for _, cmd := range tc.tamper {
				if out, err := c.topo.Node.Command(context.Background(), cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
					t.Fatalf("%v: %v: %s", cmd, err, out)
				}
			}
			if _, err := c.get(client, webVIP+":80"); err == nil {
				t.Fatal("the ClusterIP still works right after its rules were flushed: the test tampers with nothing")
			}
			start := time.Now()
			deadline := start.Add(10 * time.Second)
			for {
				if _, err := c.get(client, webVIP+":80"); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the ClusterIP still fails 10s after tampering (sync period 2s)")
				}
				time.Sleep(100 * time.Millisecond)
			}
			t.Logf("repaired %v after tampering", time.Since(start).Round(100*time.Millisecond))
			if n := c.metric(t, tc.metric); n < 1 {
				t.Errorf("%s = %v, want at least 1", tc.metric, n)
			}
		})
	}
}
