package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/internal/proctest"
	"github.com/svcproxy/svcproxy/internal/topology"
)

// bins holds the binaries TestMain builds: the real programs, run the way a
// user runs them.
var bins struct {
	dir, svcproxy, backend string
	svcproxyNoRace         string // for measuring memory: the race detector's shadow memory would swamp it
	err                    error
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "svcproxy-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins.dir = dir
	bins.svcproxy = filepath.Join(dir, "svcproxy")
	bins.backend = filepath.Join(dir, "svcproxy-backend")
	bins.svcproxyNoRace = filepath.Join(dir, "svcproxy-norace")
	for _, b := range []struct {
		out, pkg string
		race     bool
	}{
		{bins.svcproxy, "github.com/svcproxy/svcproxy/cmd/svcproxy", true},
		{bins.svcproxyNoRace, "github.com/svcproxy/svcproxy/cmd/svcproxy", false},
		{bins.backend, "github.com/svcproxy/svcproxy/cmd/svcproxy-backend", false},
	} {
		if err := proctest.Build("", b.out, b.pkg, b.race); err != nil {
			bins.err = err
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// cluster is a node running svcproxy in userspace mode with REDIRECT
// steering, real backends and a client, each in its own namespace.
type cluster struct {
	t         *testing.T
	topo      *topology.Topology
	dir       string
	backends  []*backendProc
	proxy     *exec.Cmd
	proxyOut  *proctest.Output
	proxyArgs []string // extra svcproxy flags
	proxyBin  string   // the svcproxy binary; empty: bins.svcproxy
	saved     string   // the node's iptables-save before svcproxy started
}

type backendProc struct {
	host *topology.Host
	name string
	cmd  *exec.Cmd
}

// Service addresses: VIPs in topology.FreeRange, backends on their hosts.
const (
	webVIP     = "198.19.0.10"
	webExtIP   = "198.19.1.10"
	webLBIP    = "198.19.2.10"
	webNode    = 30080
	echoVIP    = "198.19.0.11"
	dnsVIP     = "198.19.0.53"
	udpVIP     = "198.19.0.12"
	emptyVIP   = "198.19.0.99"
	proxyDebug = false
)

// newClusterWith is newCluster running the given svcproxy binary.
func newClusterWith(t *testing.T, backends int, bin string) *cluster {
	t.Helper()
	return newClusterOpts(t, backends, "", bin)
}

func newCluster(t *testing.T, backends int, extraServices string, proxyArgs ...string) *cluster {
	t.Helper()
	return newClusterOpts(t, backends, extraServices, "", proxyArgs...)
}

func newClusterOpts(t *testing.T, backends int, extraServices, bin string, proxyArgs ...string) *cluster {
	t.Helper()
	c := newNode(t, backends, extraServices)
	c.proxyArgs, c.proxyBin = proxyArgs, bin
	c.startProxy()
	return c
}

// newNode is the cluster before svcproxy starts: the namespaces, the
// Service route, the backends and the services file.
func newNode(t *testing.T, backends int, extraServices string) *cluster {
	t.Helper()
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	proctest.NeedTools(t, "iptables", "iptables-save", "ipset")
	topo := topology.NewT(t, topology.Options{Backends: backends, Clients: 1})
	c := &cluster{t: t, topo: topo, dir: t.TempDir()}
	// The node's own connections to a Service IP need a route before the
	// nat OUTPUT hook sees them (on a real node the default route does it;
	// these namespaces have none): send the VIP ranges to lo.
	for _, vips := range []netip.Prefix{topology.FreeRange, topology.FreeRange6} {
		if out, err := topo.Node.Command(context.Background(), "ip", "route", "add", vips.String(), "dev", "lo").CombinedOutput(); err != nil {
			t.Fatalf("adding the Service route: %v: %s", err, out)
		}
	}
	c.saved = c.nodeRules()
	for i, h := range topo.Backends {
		c.startBackend(h, fmt.Sprintf("backend%d", i))
	}
	c.writeServices(extraServices)
	return c
}

func (c *cluster) startBackend(h *topology.Host, name string) {
	c.t.Helper()
	cmd := h.Command(context.Background(), bins.backend, "--name", name, "--http", ":8080", "--echo", ":9000", "--udp", ":5300")
	out, err := cmd.StdoutPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("starting backend %s: %v", name, err)
	}
	ready := make(chan struct{})
	go func() {
		r := bufio.NewReader(out)
		if line, _ := r.ReadString('\n'); strings.Contains(line, "ready") {
			close(ready)
		}
		_, _ = io.Copy(io.Discard, r)
	}()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		c.t.Fatalf("backend %s did not start", name)
	}
	bp := &backendProc{host: h, name: name, cmd: cmd}
	c.backends = append(c.backends, bp)
	c.t.Cleanup(func() { bp.kill() })
}

func (b *backendProc) kill() {
	if b.cmd.Process != nil {
		_ = b.cmd.Process.Kill()
		_ = b.cmd.Wait()
	}
}

// writeServices writes the services file every test shares.
func (c *cluster) writeServices(extra string) {
	c.t.Helper()
	var eps strings.Builder
	for _, b := range c.backends {
		fmt.Fprintf(&eps, "      - ip: %s\n", b.host.Addr)
	}
	yaml := fmt.Sprintf(`services:
  - name: web
    namespace: e2e
    clusterIPs: [%s]
    externalIPs: [%s]
    loadBalancerIPs: [%s]
    ports:
      - port: 80
        targetPort: 8080
        nodePort: %d
    endpoints:
%s
  - name: echo
    namespace: e2e
    clusterIPs: [%s]
    ports:
      - port: 9000
    endpoints:
%s
  - name: udp-echo
    namespace: e2e
    clusterIPs: [%s]
    ports:
      - port: 5300
        protocol: UDP
    endpoints:
%s
  - name: empty
    namespace: e2e
    clusterIPs: [%s]
    ports:
      - port: 80
    endpoints: []
%s`, webVIP, webExtIP, webLBIP, webNode, eps.String(), echoVIP, eps.String(), udpVIP, eps.String(), emptyVIP, extra)
	if err := os.WriteFile(filepath.Join(c.dir, "services.yaml"), []byte(yaml), 0o644); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) startProxy() {
	c.t.Helper()
	args := append([]string{
		"--services", filepath.Join(c.dir, "services.yaml"),
		"--steering=redirect",
		// The suite reads, tampers with and compares iptables rules and
		// ipsets: the iptables steering backend, not auto's nftables
		// (whose table redirect's namespace tests, the sandbox and the
		// bench cover).
		"--steering-backend=iptables",
		"--hostname-override", "node",
		"--conn-log", filepath.Join(c.dir, "connections.log"),
		"--metrics-bind-address", "127.0.0.1:10249",
		"--healthz-bind-address", "127.0.0.1:10256",
		"--handover-socket", filepath.Join(c.dir, "handover.sock"),
		"--pid-file", c.pidFile(),
		"--drain-timeout", "2s",
		"--log-level", "debug"}, c.proxyArgs...)
	bin := c.proxyBin
	if bin == "" {
		bin = bins.svcproxy
	}
	c.launch(bin, args...)
	// Ready when a ClusterIP answers from the client.
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := c.get(c.topo.Clients[0], webVIP+":80"); err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("svcproxy did not start steering within 20s; output:\n%s", c.proxyOut)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// launch starts svcproxy (bin with args) on the node, its output in
// c.proxyOut; stopProxy stops it when the test ends.
func (c *cluster) launch(bin string, args ...string) {
	c.t.Helper()
	c.proxyOut = &proctest.Output{}
	cmd := c.topo.Node.Command(context.Background(), bin, args...)
	cmd.Stdout, cmd.Stderr = c.proxyOut, c.proxyOut
	// A successor started by SIGUSR2 inherits the output pipe; Wait must
	// not wait for it once this process has gone.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("starting svcproxy: %v", err)
	}
	c.proxy = cmd
	c.t.Cleanup(func() {
		c.stopProxy()
		if c.t.Failed() || proxyDebug {
			c.t.Logf("svcproxy output:\n%s", c.proxyOut)
		}
	})
}

func (c *cluster) pidFile() string { return filepath.Join(c.dir, "svcproxy.pid") }

// pid is the PID of the newest svcproxy (a successor rewrites the file).
func (c *cluster) pid() int {
	data, err := os.ReadFile(c.pidFile())
	if err != nil {
		return 0
	}
	var pid int
	fmt.Sscan(string(data), &pid)
	return pid
}

// stopProxy stops svcproxy with SIGINT and waits for it; after restarts,
// the newest one.
func (c *cluster) stopProxy() {
	if c.proxy == nil || c.proxy.ProcessState != nil {
		return
	}
	if pid := c.pid(); pid != 0 && pid != c.proxy.Process.Pid {
		// A successor started by SIGUSR2 is not our child: signal it
		// by PID, and if it will not go, have it print its goroutines
		// (SIGQUIT) into the shared output and kill it.
		_ = syscall.Kill(pid, syscall.SIGINT)
		if !proctest.WaitGone(pid, 15*time.Second) {
			c.t.Errorf("svcproxy successor %d did not exit within 15s of SIGINT", pid)
			proctest.Quit(pid)
		}
	}
	_ = c.proxy.Process.Signal(os.Interrupt)
	done := make(chan error, 1)
	go func() { done <- c.proxy.Wait() }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		c.t.Error("svcproxy did not exit within 15s of SIGINT")
		proctest.Quit(c.proxy.Process.Pid)
		<-done
	}
}

// get does GET / against addr from host and returns the backend's name.
func (c *cluster) get(h *topology.Host, addr string) (string, error) {
	return c.getWithin(h, addr, 3*time.Second)
}

// getWithin is get with budget d for the dial and again for the exchange.
func (c *cluster) getWithin(h *topology.Host, addr string, d time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	conn, err := h.Dial(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(d))
	if _, err := io.WriteString(conn, "GET / HTTP/1.0\r\nHost: svc\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(body)), nil
}

// nodeRules is the node's nat and filter tables, counters and comments left
// out, and the ipsets.
func (c *cluster) nodeRules() string {
	c.t.Helper()
	var b strings.Builder
	for _, table := range []string{"nat", "filter"} {
		out, err := c.topo.Node.Command(context.Background(), "iptables-save", "-t", table).Output()
		if err != nil {
			c.t.Fatalf("iptables-save -t %s: %v", table, err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "#") {
				continue
			}
			if strings.HasPrefix(line, ":") { // ":CHAIN POLICY [p:b]": drop counters
				if i := strings.LastIndex(line, " ["); i > 0 {
					line = line[:i]
				}
			}
			b.WriteString(line + "\n")
		}
	}
	out, err := c.topo.Node.Command(context.Background(), "ipset", "list", "-n").Output()
	if err != nil {
		c.t.Fatalf("ipset list -n: %v", err)
	}
	b.WriteString("ipsets:\n" + string(out))
	return b.String()
}

// spread asserts that n requests to addr from host all succeed and reach
// every backend.
func (c *cluster) spread(h *topology.Host, addr string, n int) {
	c.t.Helper()
	seen := map[string]int{}
	for i := 0; i < n; i++ {
		name, err := c.get(h, addr)
		if err != nil {
			c.t.Fatalf("request %d to %s from %s: %v", i, addr, h.Name, err)
		}
		seen[name]++
	}
	for _, b := range c.backends {
		if seen[b.name] == 0 {
			c.t.Errorf("%s from %s: backend %s got none of %d requests (%v)", addr, h.Name, b.name, n, seen)
		}
	}
}

// dialTimed connects from h to addr and returns the error and how long it
// took.
func dialTimed(h *topology.Host, network, addr string) (net.Conn, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	conn, err := h.Dial(ctx, network, addr)
	return conn, time.Since(start), err
}
