package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/svcproxy/svcproxy/internal/topology"
)

// namespacePrefix names the bench's namespaces, so leftovers of a crashed
// run are told apart from the tests' and the sandbox's.
const namespacePrefix = "svcproxy-bench-"

// The data-path Services. Every mode carries the same frontends: the
// keep-alive, connection-rate, 1 MiB and idle tests use web:http, the bulk
// tests web:iperf (or web:http with the built-in generator), the fault test
// fault (three endpoints). web has one endpoint, so `direct` (which can only
// talk to one backend) sees the same server as every proxy.
var (
	webVIP   = netip.MustParseAddr("198.19.0.10")
	faultVIP = netip.MustParseAddr("198.19.0.11")
	dnsVIP   = netip.MustParseAddr("198.19.0.12")
)

const (
	portHTTP  = 80   // backend0's HTTP server (nginx or svcproxy-backend)
	portIperf = 5201 // backend0's iperf3 server
	portFault = 8081 // every backend's svcproxy-backend, killed in the fault test
	svcHTTP   = "bench/web:http"
	svcIperf  = "bench/web:iperf"
	svcFault  = "bench/fault:http"
	portDNS   = 53 // every backend's dnsmasq (UDP), when dnsperf and dnsmasq are installed
	svcDNS    = "bench/dns:dns"
)

// SvcPort is one Service port: a frontend and its endpoints (all on one
// port). Plain data, shared by every mode's configuration writer.
type SvcPort struct {
	Namespace, Service, PortName string
	Protocol                     string // "TCP" or "UDP"
	VIP                          netip.Addr
	Port                         uint16
	Endpoints                    []netip.AddrPort
}

// Key is kube-proxy's service port name: namespace/name:port.
func (s SvcPort) Key() string { return s.Namespace + "/" + s.Service + ":" + s.PortName }

// Frontend is the VIP and port clients connect to.
func (s SvcPort) Frontend() netip.AddrPort { return netip.AddrPortFrom(s.VIP, s.Port) }

// Cluster is one mode's throwaway namespaces with the backends running.
type Cluster struct {
	Env      *Env
	Topo     *topology.Topology
	Dir      string    // scratch files of this cluster
	Services []SvcPort // the data-path Services; nil for a control-plane cluster

	mu    sync.Mutex
	procs []*Proc
	fault []*Proc // each backend's fault-test server, by backend index
}

// newCluster builds namespaces: clients and backends as given (negative:
// none), and a node that routes the VIP range to lo for its own traffic.
func newCluster(e *Env, name string, clients, backends int) (*Cluster, error) {
	topo, err := topology.New(topology.Options{Prefix: namespacePrefix, Clients: clients, Backends: backends, NoSignalCleanup: true})
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(e.Scratch, name+"-")
	if err != nil {
		_ = topo.Close()
		return nil, err
	}
	c := &Cluster{Env: e, Topo: topo, Dir: dir}
	if out, err := topo.Node.Command(context.Background(), "ip", "route", "add", topology.FreeRange.String(), "dev", "lo").CombinedOutput(); err != nil {
		c.Close()
		return nil, fmt.Errorf("routing the Service range to lo on the node: %v: %s", err, out)
	}
	return c, nil
}

// Close stops every process the cluster started and deletes its namespaces.
func (c *Cluster) Close() error {
	c.mu.Lock()
	procs := c.procs
	c.procs = nil
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() { defer wg.Done(); p.Stop() }()
	}
	wg.Wait()
	return c.Topo.Close()
}

// Proc is a long-running program the bench started.
type Proc struct {
	Name    string
	Cmd     *exec.Cmd
	LogPath string // its stdout and stderr
	done    chan struct{}
	err     error
}

// Start runs name in h's namespace with its output in the cluster's
// directory; Close stops it.
func (c *Cluster) Start(h *topology.Host, label string, name string, args ...string) (*Proc, error) {
	return c.StartLines(h, label, nil, name, args...)
}

// StartLines is Start that also hands each line of output to onLine (nil:
// none), from one goroutine.
func (c *Cluster) StartLines(h *topology.Host, label string, onLine func([]byte), name string, args ...string) (*Proc, error) {
	logPath := filepath.Join(c.Dir, label+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := h.Command(context.Background(), name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the bench
	var pr, pw *os.File
	if onLine == nil {
		cmd.Stdout, cmd.Stderr = f, f
	} else {
		if pr, pw, err = os.Pipe(); err != nil {
			f.Close()
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = pw, pw
	}
	err = cmd.Start()
	if pw != nil {
		pw.Close()
	}
	if err != nil {
		f.Close()
		if pr != nil {
			pr.Close()
		}
		return nil, fmt.Errorf("starting %s: %w", label, err)
	}
	p := &Proc{Name: label, Cmd: cmd, LogPath: logPath, done: make(chan struct{})}
	read := make(chan struct{})
	if pr == nil {
		close(read)
	} else {
		go func() {
			defer close(read)
			defer pr.Close()
			sc := bufio.NewScanner(pr)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				f.Write(append(sc.Bytes(), '\n'))
				onLine(sc.Bytes())
			}
		}()
	}
	go func() {
		p.err = cmd.Wait()
		<-read
		f.Close()
		close(p.done)
	}()
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, nil
}

// Pid is the program's process id (ip netns exec execs it in place).
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Exited tells whether the program has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop ends the program: SIGTERM, then SIGKILL after 3 s.
func (p *Proc) Stop() {
	if p.Exited() {
		return
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(3 * time.Second):
		_ = p.Cmd.Process.Kill()
		<-p.done
	}
}

// Kill ends the program at once with SIGKILL and waits for it.
func (p *Proc) Kill() {
	_ = p.Cmd.Process.Kill()
	<-p.done
}

// Tail is the last n lines of the program's output, for error messages.
func (p *Proc) Tail(n int) string {
	data, err := os.ReadFile(p.LogPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// failure wraps err with the program's last lines of output.
func (p *Proc) failure(err error) error {
	if t := p.Tail(15); t != "" {
		return fmt.Errorf("%s: %w; its last output:\n%s", p.Name, err, t)
	}
	return fmt.Errorf("%s: %w", p.Name, err)
}

// startBackends starts backend0's HTTP server (nginx, else svcproxy-backend)
// and iperf3 server, and every backend's fault-test server, and waits until
// each port accepts connections. It fills c.Services.
func (c *Cluster) startBackends(ctx context.Context) error {
	e := c.Env
	b0 := c.Topo.Backends[0]
	if e.Tools.Nginx != "" {
		conf, err := c.writeBackendNginx()
		if err != nil {
			return err
		}
		if _, err := c.Start(b0, "backend0-nginx", e.Tools.Nginx, "-p", c.Dir, "-c", conf, "-e", filepath.Join(c.Dir, "backend0-nginx.error.log")); err != nil {
			return err
		}
	} else {
		if _, err := c.Start(b0, "backend0-http", e.Backend, "--name", "backend0", "--http", fmt.Sprintf(":%d", portHTTP)); err != nil {
			return err
		}
	}
	if e.useIperf() {
		if _, err := c.Start(b0, "backend0-iperf3", e.Tools.Iperf3, "-s", "-p", fmt.Sprint(portIperf)); err != nil {
			return err
		}
	}
	c.fault = nil
	for i, h := range c.Topo.Backends {
		p, err := c.Start(h, fmt.Sprintf("backend%d-fault", i), e.Backend, "--name", fmt.Sprintf("backend%d", i), "--http", fmt.Sprintf(":%d", portFault))
		if err != nil {
			return err
		}
		c.fault = append(c.fault, p)
	}
	wait := []netip.AddrPort{netip.AddrPortFrom(b0.Addr, portHTTP)}
	if e.useIperf() {
		wait = append(wait, netip.AddrPortFrom(b0.Addr, portIperf))
	}
	for _, h := range c.Topo.Backends {
		wait = append(wait, netip.AddrPortFrom(h.Addr, portFault))
	}
	for _, a := range wait {
		if err := waitListening(ctx, c.Topo.Node, a, 10*time.Second); err != nil {
			return fmt.Errorf("backend %s: %w", a, err)
		}
	}
	var faultEPs []netip.AddrPort
	for _, h := range c.Topo.Backends {
		faultEPs = append(faultEPs, netip.AddrPortFrom(h.Addr, portFault))
	}
	c.Services = []SvcPort{
		{Namespace: "bench", Service: "web", PortName: "http", Protocol: "TCP", VIP: webVIP, Port: portHTTP, Endpoints: []netip.AddrPort{netip.AddrPortFrom(b0.Addr, portHTTP)}},
		{Namespace: "bench", Service: "web", PortName: "iperf", Protocol: "TCP", VIP: webVIP, Port: portIperf, Endpoints: []netip.AddrPort{netip.AddrPortFrom(b0.Addr, portIperf)}},
		{Namespace: "bench", Service: "fault", PortName: "http", Protocol: "TCP", VIP: faultVIP, Port: 80, Endpoints: faultEPs},
	}
	if e.Tools.Dnsperf != "" && e.Tools.Dnsmasq != "" {
		var dnsEPs []netip.AddrPort
		for i, h := range c.Topo.Backends {
			// dnsmasq answers svc.bench from its own table: a real DNS
			// server with no upstream to wait for.
			if _, err := c.Start(h, fmt.Sprintf("backend%d-dnsmasq", i), e.Tools.Dnsmasq, "--keep-in-foreground", "--no-resolv", "--no-hosts",
				fmt.Sprintf("--port=%d", portDNS), "--listen-address="+h.Addr.String(), "--bind-interfaces", "--user=root", "--pid-file=",
				"--cache-size=1000", "--dns-forward-max=10000", "--address=/"+dnsName+"/198.18.9.1", "--log-facility=/dev/null"); err != nil {
				return err
			}
			ep := netip.AddrPortFrom(h.Addr, portDNS)
			if err := waitListening(ctx, c.Topo.Node, ep, 10*time.Second); err != nil { // its TCP side: up with the UDP one
				return fmt.Errorf("backend dnsmasq %s: %w", ep, err)
			}
			dnsEPs = append(dnsEPs, ep)
		}
		c.Services = append(c.Services, SvcPort{Namespace: "bench", Service: "dns", PortName: "dns", Protocol: "UDP", VIP: dnsVIP, Port: portDNS, Endpoints: dnsEPs})
	}
	return nil
}

// httpPaths are the URLs of the HTTP tests on backend0's server.
type httpPaths struct{ small, mib, bulk string }

func (c *Cluster) paths() httpPaths {
	if c.Env.Tools.Nginx != "" {
		return httpPaths{small: "/1k", mib: "/1m", bulk: "/bytes?n=1099511627776"} // bulk is served only by svcproxy-backend
	}
	return httpPaths{small: "/bytes?n=1024", mib: "/bytes?n=1048576", bulk: "/bytes?n=1099511627776"}
}

func (c *Cluster) writeBackendNginx() (string, error) {
	www := filepath.Join(c.Dir, "www")
	if err := os.MkdirAll(www, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(www, "1k"), []byte(strings.Repeat("x", 1023)+"\n"), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(www, "1m"), make([]byte, 1<<20), 0o644); err != nil {
		return "", err
	}
	conf := fmt.Sprintf(`# backend0's HTTP server for the bench (not a proxy under test)
user root;
worker_processes 2;
worker_rlimit_nofile 200000;
pid %[1]s/backend0-nginx.pid;
daemon off;
error_log %[1]s/backend0-nginx.error.log warn;
events { worker_connections 30000; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_requests 100000000;
    keepalive_timeout 600s;
    client_header_timeout 600s;
    default_type application/octet-stream;
    open_file_cache max=16;
    client_body_temp_path %[1]s/tmp;
    proxy_temp_path %[1]s/tmp;
    fastcgi_temp_path %[1]s/tmp;
    uwsgi_temp_path %[1]s/tmp;
    scgi_temp_path %[1]s/tmp;
    server {
        listen %[2]d backlog=8192;
        root %[3]s;
        location / { }
        location = /status { stub_status; }
    }
}
`, c.Dir, portHTTP, www)
	path := filepath.Join(c.Dir, "backend0-nginx.conf")
	return path, os.WriteFile(path, []byte(conf), 0o644)
}

// waitListening dials addr from h until it connects or timeout passes.
func waitListening(ctx context.Context, h *topology.Host, addr netip.AddrPort, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		dctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		conn, err := h.Dial(dctx, "tcp", addr.String())
		cancel()
		if err == nil {
			conn.Close()
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not listening after %v: %w", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitProcListening waits until p listens on addr (dialing from h), failing
// at once when p exits.
func waitProcListening(ctx context.Context, p *Proc, h *topology.Host, addr netip.AddrPort) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if p.Exited() {
			return p.failure(errors.New("exited during start-up"))
		}
		err := waitListening(ctx, h, addr, 0)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return p.failure(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// httpGet does one GET on a new connection from h and returns the status
// and body.
func httpGet(ctx context.Context, h *topology.Host, addr netip.AddrPort, path string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := h.Dial(ctx, "tcp", addr.String())
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n", path); err != nil {
		return 0, nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// checkServing verifies that run carries every data-path Service from the
// client: web:http answers with the 1 KiB body, and (for modes that
// balance) fault:http reaches all three backends.
func checkServing(ctx context.Context, c *Cluster, run *Running) error {
	client := c.Topo.Clients[0]
	web := run.Targets[svcHTTP]
	var lastErr error
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, body, err := httpGet(ctx, client, web, c.paths().small)
		if err == nil && code == 200 && len(body) == 1024 {
			break
		}
		if err == nil {
			err = fmt.Errorf("status %d, %d bytes (want 200, 1024)", code, len(body))
		}
		lastErr = err
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("web:http via %s not served within 15s: %w", web, lastErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !run.Balances {
		return nil
	}
	seen := map[string]bool{}
	for i := 0; i < 30 && len(seen) < len(c.Topo.Backends); i++ {
		code, body, err := httpGet(ctx, client, run.Targets[svcFault], "/")
		if err != nil {
			return fmt.Errorf("fault:http via %s: %w", run.Targets[svcFault], err)
		}
		if code != 200 {
			return fmt.Errorf("fault:http via %s: status %d", run.Targets[svcFault], code)
		}
		seen[strings.TrimSpace(string(body))] = true
	}
	if len(seen) < len(c.Topo.Backends) {
		return fmt.Errorf("fault:http reached only %d of %d backends in 30 requests", len(seen), len(c.Topo.Backends))
	}
	return nil
}

// errClass names the kind of a client-visible failure.
func errClass(err error) string {
	var ne net.Error
	switch {
	case err == nil:
		return ""
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "reset"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	}
	return "other"
}

// tcpServices is services without the UDP ones, for a proxy that has no
// UDP (HAProxy).
func tcpServices(services []SvcPort) []SvcPort {
	var out []SvcPort
	for _, s := range services {
		if s.Protocol != "UDP" {
			out = append(out, s)
		}
	}
	return out
}

// lowerProto is s's protocol as iptables and nginx spell it.
func (s SvcPort) lowerProto() string {
	if s.Protocol == "UDP" {
		return "udp"
	}
	return "tcp"
}
