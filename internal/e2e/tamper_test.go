package e2e

import (
	"context"
	"testing"
	"time"
)

// TestPrivilegedTamperingRepaired: someone flushes svcproxy's nat chain
// and destroys its ipsets' members; the periodic full sync puts them back
// within the sync period and counts a repair.
func TestPrivilegedTamperingRepaired(t *testing.T) {
	c := newCluster(t, 2, "", "--sync-period=2s")
	client := c.topo.Clients[0]
	for _, cmd := range [][]string{
		{"iptables", "-t", "nat", "-F", "SVCPROXY-SERVICES"},
		{"ipset", "flush", "svcproxy-svc-v4"},
	} {
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
	if n := c.metric(t, "svcproxy_redirect_repairs_total"); n < 1 {
		t.Errorf("svcproxy_redirect_repairs_total = %v, want at least 1", n)
	}
}
