package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"slices"

	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/internal/proctest"
	"github.com/svcproxy/svcproxy/internal/topology"
)

const dnsVIPService = `
  - name: dns
    namespace: e2e
    clusterIPs: [` + dnsVIP + `]
    ports:
      - port: 53
        protocol: UDP
    endpoints:
%s`

// TestPrivilegedUserspaceMode: every Service type, from a pod and from the
// node itself, reaches every backend through the forwarder, steered by
// REDIRECT rules (iptables + ipset, as the suite's other tests) and by
// local addresses (the virtual IPs on a dummy interface, no rules).
func TestPrivilegedUserspaceMode(t *testing.T) {
	for _, steering := range []string{"redirect", "local"} {
		t.Run(steering, func(t *testing.T) { testUserspaceMode(t, steering) })
	}
}

func testUserspaceMode(t *testing.T, steering string) {
	c := newCluster(t, 3, "", "--steering="+steering)
	client := c.topo.Clients[0]
	if steering == "local" {
		t.Run("virtual IPs on the dummy interface, no steering rules", func(t *testing.T) {
			out, err := c.topo.Node.Command(context.Background(), "ip", "-o", "addr", "show", "dev", "svcproxy-vips").CombinedOutput()
			if err != nil {
				t.Fatalf("ip addr show dev svcproxy-vips: %v: %s", err, out)
			}
			for _, vip := range []string{webVIP, webExtIP, webLBIP, echoVIP, udpVIP, emptyVIP} {
				if !strings.Contains(string(out), " "+vip+"/32 ") {
					t.Errorf("%s is not on svcproxy-vips:\n%s", vip, out)
				}
			}
			if got := c.metric(t, "svcproxy_local_steering_addresses"); got != 6 {
				t.Errorf("svcproxy_local_steering_addresses = %v, want 6", got)
			}
			if rules := c.nodeRules(); rules != c.saved {
				t.Errorf("local steering changed the node's rules:\n%s\nwas:\n%s", rules, c.saved)
			}
			if out, err := c.topo.Node.Command(context.Background(), "nft", "list", "tables").CombinedOutput(); err != nil || strings.Contains(string(out), "svcproxy") {
				t.Errorf("nft list tables: %v: %s (want no svcproxy table)", err, out)
			}
		})
	}
	if steering == "redirect" {
		samples := proctest.Scrape(t, c.topo.Node.Dial, "http://127.0.0.1:10249/metrics")
		for _, series := range []string{"svcproxy_conntrack_unserved_entries_deleted_total ", `kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"} `} {
			if !slices.ContainsFunc(samples, func(l string) bool { return strings.HasPrefix(l, series) }) {
				t.Errorf("%sis not exported with REDIRECT steering", series)
			}
		}
	}
	for _, tc := range []struct {
		name string
		from *topology.Host
		addr string
	}{
		{"ClusterIP from a pod", client, webVIP + ":80"},
		{"ClusterIP from the node", c.topo.Node, webVIP + ":80"},
		{"NodePort via the node address", client, fmt.Sprintf("%s:%d", topology.NodeAddr, webNode)},
		{"NodePort from the node itself", c.topo.Node, fmt.Sprintf("%s:%d", topology.NodeAddr, webNode)},
		{"ExternalIP", client, webExtIP + ":80"},
		{"LoadBalancer IP", client, webLBIP + ":80"},
	} {
		t.Run(tc.name, func(t *testing.T) { c.spread(tc.from, tc.addr, 30) })
	}

	t.Run("the NodePort is claimed", func(t *testing.T) {
		ln, err := c.topo.Node.Listen(context.Background(), "tcp", fmt.Sprintf(":%d", webNode))
		if err == nil {
			ln.Close()
			t.Fatalf("another program on the node could listen on NodePort %d", webNode)
		}
	})

	t.Run("no endpoints is turned away at once", func(t *testing.T) {
		for i := 0; i < 5; i++ {
			start := time.Now()
			conn, took, err := dialTimed(client, "tcp", emptyVIP+":80")
			if steering == "local" {
				// The forwarder listens on the frontend: it accepts, logs
				// the connection as no_endpoints and resets it, which the
				// client sees at connect or at its first read.
				if err == nil {
					_ = conn.SetReadDeadline(time.Now().Add(time.Second))
					_, err = conn.Read(make([]byte, 1))
					conn.Close()
				}
				if took = time.Since(start); !errors.Is(err, syscall.ECONNRESET) {
					t.Fatalf("read from a Service with no endpoints: %v, want connection reset", err)
				}
				if took > 100*time.Millisecond {
					t.Errorf("reset took %v, want under 100ms", took)
				}
				continue
			}
			if err == nil {
				conn.Close()
				t.Fatal("connected to a Service with no endpoints")
			}
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("dial error %v, want connection refused", err)
			}
			if took > 100*time.Millisecond {
				t.Errorf("refusal took %v, want under 100ms", took)
			}
		}
	})

	t.Run("unknown port on a VIP is not steered", func(t *testing.T) {
		// Nothing owns 198.19.0.10:81: the packet leaves the client toward
		// the node, which has no route for it and no listener; it must not
		// land in the forwarder (which would reset it as "no_service").
		conn, _, err := dialTimed(client, "tcp", webVIP+":81")
		if err == nil {
			conn.Close()
			t.Fatal("connected to a port no Service has")
		}
	})

	t.Run("UDP echo through a ClusterIP, 64 KiB datagrams", func(t *testing.T) {
		for _, size := range []int{10, 1400, 60000} {
			msg := make([]byte, size)
			_, _ = rand.Read(msg)
			reply, err := udpQuery(client, udpVIP+":5300", msg)
			if err != nil {
				t.Fatalf("%d bytes: %v", size, err)
			}
			_, rest, _ := bytes.Cut(reply, []byte(" "))
			if !bytes.Equal(rest, msg) {
				t.Fatalf("%d bytes: reply of %d bytes differs", size, len(reply))
			}
		}
	})

	t.Run("connection log", func(t *testing.T) {
		deadline := time.Now().Add(3 * time.Second)
		for {
			data, _ := os.ReadFile(filepath.Join(c.dir, "connections.log"))
			if bytes.Contains(data, []byte(`"service":"e2e/web"`)) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no e2e/web line in the connection log:\n%s", data)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	if steering == "local" {
		t.Run("stopping removes the virtual IPs", func(t *testing.T) {
			c.stopProxy()
			if out, err := c.topo.Node.Command(context.Background(), "ip", "link", "show", "svcproxy-vips").CombinedOutput(); err == nil {
				t.Errorf("svcproxy-vips is still there after svcproxy stopped:\n%s", out)
			}
			if _, _, err := dialTimed(client, "tcp", webVIP+":80"); err == nil {
				t.Error("the ClusterIP still answers after svcproxy stopped")
			}
		})
	}
}

// TestPrivilegedBackendKilledMidRun: a backend process is killed under
// load, and not one connection opened after its death fails: each of its
// refusals is retried on another backend. Requests already inside the dead
// backend when it died are lost, as with any L4 proxy; they are counted,
// not judged.
func TestPrivilegedBackendKilledMidRun(t *testing.T) {
	c := newCluster(t, 3, "")
	client := c.topo.Clients[0]
	const n = 600
	var killedAt atomic.Int64
	var inFlightLost atomic.Int64
	errs := proctest.Parallel(n, 8, func(i int) error {
		if i == n/3 {
			c.backends[1].kill()
			killedAt.Store(time.Now().UnixNano())
		}
		start := time.Now().UnixNano()
		_, err := c.get(client, webVIP+":80")
		if err != nil {
			if k := killedAt.Load(); k == 0 || start < k {
				inFlightLost.Add(1)
				return nil
			}
		}
		return err
	})
	if len(errs) > 0 {
		t.Fatalf("%d of %d connections opened after the kill failed; first: %v", len(errs), n, errs[0])
	}
	t.Logf("%d requests; %d were in flight in the dead backend when it died and were lost", n, inFlightLost.Load())
	// Afterwards the dead backend gets nothing; the others still serve.
	for i := 0; i < 30; i++ {
		name, err := c.get(client, webVIP+":80")
		if err != nil {
			t.Fatal(err)
		}
		if name == c.backends[1].name {
			t.Fatalf("request went to killed backend %s", name)
		}
	}
}

// TestPrivilegedDNS: a real resolver (dig) against real DNS servers
// (dnsmasq) through a UDP ClusterIP, then with one server down.
func TestPrivilegedDNS(t *testing.T) {
	proctest.NeedTools(t, "dig", "dnsmasq")
	// The base cluster plus a dns Service on every backend's port 53.
	topoBackends := 2
	var eps strings.Builder
	for i := 0; i < topoBackends; i++ {
		fmt.Fprintf(&eps, "      - ip: 198.18.2.%d\n", i+1)
	}
	c := newCluster(t, topoBackends, fmt.Sprintf(dnsVIPService, eps.String()))
	var servers []*exec.Cmd
	for i, h := range c.topo.Backends {
		cmd := h.Command(context.Background(), "dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts",
			"--port=53", "--listen-address="+h.Addr.String(), "--bind-interfaces", "--user=root", "--pid-file=",
			fmt.Sprintf("--address=/svc.e2e/198.18.9.%d", i+1), "--log-facility=-")
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting dnsmasq: %v", err)
		}
		servers = append(servers, cmd)
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
	client := c.topo.Clients[0]
	queries := func(n int) (answered int, answers map[string]int) {
		t.Helper()
		var batch strings.Builder
		for i := 0; i < n; i++ {
			fmt.Fprintf(&batch, "q%d.svc.e2e A\n", i)
		}
		file := filepath.Join(c.dir, "queries")
		if err := os.WriteFile(file, []byte(batch.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := client.Command(context.Background(), "dig", "@"+dnsVIP, "-f", file, "+short", "+tries=3", "+time=1").CombinedOutput()
		if err != nil {
			t.Logf("dig: %v", err)
		}
		answers = map[string]int{}
		for _, line := range strings.Fields(string(out)) {
			if strings.HasPrefix(line, "198.18.9.") {
				answered++
				answers[line]++
			}
		}
		return answered, answers
	}
	// Wait for dnsmasq to listen.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if n, _ := queries(1); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("DNS through the ClusterIP never answered; svcproxy output:\n%s", c.proxyOut)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n, answers := queries(200); n != 200 {
		t.Fatalf("%d of 200 queries answered", n)
	} else if len(answers) != 2 {
		t.Errorf("answers came from %d servers, want 2: %v", len(answers), answers)
	}
	// One server down: its port answers ICMP unreachable; the resolver's
	// retry lands on the other server.
	_ = servers[0].Process.Kill()
	_ = servers[0].Wait()
	if n, answers := queries(100); n != 100 {
		t.Fatalf("with one server down, %d of 100 queries answered", n)
	} else if answers["198.18.9.1"] != 0 {
		t.Errorf("answers from the dead server: %v", answers)
	}
}

// TestPrivilegedCleanup: a clean exit removes every rule and set; so does
// --cleanup after a crash. The node's tables end as they began.
func TestPrivilegedCleanup(t *testing.T) {
	c := newCluster(t, 2, "")
	if c.nodeRules() == c.saved {
		t.Fatal("svcproxy is running but the node's rules are unchanged")
	}
	c.stopProxy()
	if got := c.nodeRules(); got != c.saved {
		t.Fatalf("rules after a clean exit differ from before:\nbefore:\n%s\nafter:\n%s", c.saved, got)
	}

	// A crash leaves the rules; --cleanup removes them.
	c.startProxy()
	_ = c.proxy.Process.Kill()
	_ = c.proxy.Wait()
	if c.nodeRules() == c.saved {
		t.Fatal("after SIGKILL the rules are already gone; the --cleanup check would prove nothing")
	}
	out, err := c.topo.Node.Command(context.Background(), bins.svcproxy, "--cleanup").CombinedOutput()
	if err != nil {
		t.Fatalf("svcproxy --cleanup: %v\n%s", err, out)
	}
	if got := c.nodeRules(); got != c.saved {
		t.Fatalf("rules after --cleanup differ from before:\nbefore:\n%s\nafter:\n%s", c.saved, got)
	}
}

// TestPrivilegedSteeringSwitch: a node whose steering is changed after a
// crash (the ConfigMap edited, the pod killed) serves with the new steering
// and keeps nothing of the old: REDIRECT rules left by a killed process are
// removed when local steering starts, and local steering's device when
// REDIRECT steering starts; --cleanup removes the device a killed local run
// left.
func TestPrivilegedSteeringSwitch(t *testing.T) {
	c := newCluster(t, 2, "", "--steering=redirect")
	client := c.topo.Clients[0]
	kill := func() {
		_ = c.proxy.Process.Kill()
		_ = c.proxy.Wait()
	}
	hasDevice := func() bool {
		return c.topo.Node.Command(context.Background(), "ip", "link", "show", "svcproxy-vips").Run() == nil
	}
	kill()
	if c.nodeRules() == c.saved {
		t.Fatal("after SIGKILL the REDIRECT rules are already gone; the switch would prove nothing")
	}

	c.proxyArgs = []string{"--steering=local"}
	c.startProxy()
	if got := c.nodeRules(); got != c.saved {
		t.Errorf("local steering started with REDIRECT rules left by the killed run:\n%s\nbefore svcproxy:\n%s", got, c.saved)
	}
	if !hasDevice() {
		t.Fatal("local steering serves without svcproxy-vips")
	}
	c.spread(client, webVIP+":80", 10)
	kill()

	c.proxyArgs = []string{"--steering=redirect"}
	c.startProxy()
	if hasDevice() {
		t.Error("REDIRECT steering started with svcproxy-vips left by the killed local run")
	}
	c.spread(client, webVIP+":80", 10)
	c.stopProxy()

	c.proxyArgs = []string{"--steering=local"}
	c.startProxy()
	kill()
	if !hasDevice() {
		t.Fatal("after SIGKILL svcproxy-vips is already gone; the --cleanup check would prove nothing")
	}
	if out, err := c.topo.Node.Command(context.Background(), bins.svcproxy, "--cleanup").CombinedOutput(); err != nil {
		t.Fatalf("svcproxy --cleanup: %v\n%s", err, out)
	}
	if hasDevice() {
		t.Error("svcproxy-vips is still there after --cleanup")
	}
}

// udpQuery sends msg from host to addr over a connected UDP socket, which
// accepts only replies from addr itself, and returns the reply.
func udpQuery(h *topology.Host, addr string, msg []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := h.Dial(ctx, "udp", addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	buf := make([]byte, 1<<16)
	for try := 0; try < 5; try++ {
		if _, err := conn.Write(msg); err != nil {
			return nil, err
		}
		_ = conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		n, err := conn.Read(buf)
		if err == nil {
			return buf[:n], nil
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			return nil, err
		}
	}
	return nil, fmt.Errorf("no reply from %s", addr)
}
