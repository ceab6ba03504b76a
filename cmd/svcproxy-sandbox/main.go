// Command svcproxy-sandbox is the first thing to run: it builds a small
// cluster out of network namespaces (a client "pod", a node, two backends),
// runs the real svcproxy on the node in userspace mode with REDIRECT
// steering of a ClusterIP and a NodePort (on the steering backend svcproxy
// chooses, or --steering-backend), says which backend steers and shows its
// rules — or, with --steering=local, the virtual IPs on svcproxy's dummy
// interface and no rules — sends traffic, shows what happened, and keeps
// everything up until Ctrl-C, when it removes it all. It touches nothing
// outside the namespaces it creates.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/svcproxy/svcproxy/internal/topology"
)

const (
	clusterIP = "198.19.0.10"
	nodePort  = 30080
)

func main() {
	svcproxy := flag.String("svcproxy", "bin/svcproxy", "the svcproxy binary")
	backend := flag.String("backend", "bin/svcproxy-backend", "the svcproxy-backend binary")
	steeringBackend := flag.String("steering-backend", "", "svcproxy's --steering-backend: auto, nftables or iptables; empty: svcproxy's default (auto)")
	steering := flag.String("steering", "redirect", "svcproxy's --steering: redirect (rules) or local (the virtual IPs as the node's addresses, no rules)")
	flag.Parse()
	if *steering == "" {
		*steering = "redirect"
	}
	if *steering != "redirect" && *steering != "local" {
		fmt.Fprintf(os.Stderr, "sandbox: --steering: want redirect or local, got %q\n", *steering)
		os.Exit(2)
	}
	if err := run(*svcproxy, *backend, *steering, *steeringBackend); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox:", err)
		os.Exit(1)
	}
}

func run(svcproxyBin, backendBin, steeringMode, steeringBackend string) error {
	if os.Geteuid() != 0 {
		return errors.New("the sandbox creates network namespaces and iptables rules inside them, which needs root: run `sudo make run`")
	}
	local := steeringMode == "local"
	tools := []string{"ip", "iptables", "ipset"} // auto falls back to iptables + ipset where nftables is refused
	if steeringBackend == "nftables" || local {
		tools = []string{"ip"}
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is not installed: run `sudo make deps` first", tool)
		}
	}
	for _, bin := range []string{svcproxyBin, backendBin} {
		if _, err := os.Stat(bin); err != nil {
			return fmt.Errorf("%s: %w (build with `make build`)", bin, err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	step("creating namespaces: a client pod, a node, two backends (198.18.0.0/15, no default route)")
	topo, err := topology.New(topology.Options{Backends: 2, Clients: 1, NoSignalCleanup: true})
	if err != nil {
		return err
	}
	defer func() {
		step("removing the namespaces")
		_ = topo.Close()
	}()
	node, client := topo.Node, topo.Clients[0]
	if out, err := node.Command(ctx, "ip", "route", "add", topology.FreeRange.String(), "dev", "lo").CombinedOutput(); err != nil {
		return fmt.Errorf("routing the Service range on the node: %v: %s", err, out)
	}

	dir, err := os.MkdirTemp("", "svcproxy-sandbox-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Signal(os.Interrupt)
			_ = p.Wait()
		}
	}()
	var eps strings.Builder
	for i, h := range topo.Backends {
		name := fmt.Sprintf("backend%d", i)
		cmd := h.Command(ctx, backendBin, "--name", name, "--http", ":8080")
		if err := startAndWait(cmd, "ready"); err != nil {
			return fmt.Errorf("starting %s: %w", name, err)
		}
		procs = append(procs, cmd)
		fmt.Printf("    %s: HTTP on %s:8080 (namespace %s)\n", name, h.Addr, h.NS)
		fmt.Fprintf(&eps, "      - ip: %s\n        nodeName: sandbox-node\n", h.Addr)
	}

	services := fmt.Sprintf(`services:
  - name: web
    namespace: sandbox
    clusterIPs: [%s]
    ports:
      - port: 80
        targetPort: 8080
        nodePort: %d
    endpoints:
%s`, clusterIP, nodePort, eps.String())
	servicesFile := filepath.Join(dir, "services.yaml")
	connLog := filepath.Join(dir, "connections.log")
	if err := os.WriteFile(servicesFile, []byte(services), 0o644); err != nil {
		return err
	}
	if local {
		step("starting svcproxy on the node: userspace mode, local steering (--steering=local)")
	} else {
		step("starting svcproxy on the node: userspace mode, REDIRECT steering (--steering-backend=" + firstNonEmpty(steeringBackend, "auto") + ")")
	}
	fmt.Printf("    services file %s:\n%s", servicesFile, indent(services))
	proxyLog := filepath.Join(dir, "svcproxy.log")
	logFile, err := os.Create(proxyLog)
	if err != nil {
		return err
	}
	defer logFile.Close()
	args := []string{"--services", servicesFile, "--steering=" + steeringMode,
		"--hostname-override", "sandbox-node", "--conn-log", connLog,
		"--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address", "127.0.0.1:10256",
		// The node's primary IP, as a DaemonSet's svcproxy reads it from
		// the Node's InternalIP: REDIRECT steering DNATs to it.
		"--bind-address", topology.NodeAddr.String()}
	if steeringBackend != "" && !local {
		args = append(args, "--steering-backend="+steeringBackend)
	}
	proxy := node.Command(context.Background(), svcproxyBin, args...)
	proxy.Stdout, proxy.Stderr = logFile, logFile
	if err := proxy.Start(); err != nil {
		return err
	}
	defer func() {
		step("stopping svcproxy (it drains connections and removes its rules or its virtual IPs)")
		_ = proxy.Process.Signal(os.Interrupt)
		_ = proxy.Wait()
	}()
	if err := waitReady(ctx, client, clusterIP+":80"); err != nil {
		return fmt.Errorf("%w; the end of svcproxy's log:\n%s", err, tail(proxyLog, 15))
	}

	if local {
		step("local steering: the ClusterIP is an address of the node, on svcproxy's dummy interface; no rules")
		out, err := node.Command(ctx, "ip", "addr", "show", "dev", "svcproxy-vips").CombinedOutput()
		if err != nil {
			return fmt.Errorf("svcproxy serves but has no svcproxy-vips interface: %v: %s", err, out)
		}
		fmt.Print("    ip addr show dev svcproxy-vips:\n" + indent(string(out)))
	} else {
		steering, fields := steeringLine(proxyLog)
		if steering == "" {
			return fmt.Errorf("svcproxy serves but its log says nothing of its steering backend; the end of its log:\n%s", tail(proxyLog, 15))
		}
		step("steering: " + steering)
		fmt.Printf("    svcproxy's log: steering with %s %s\n", steering, fields)
		showRules(ctx, node, steering)
	}

	step(fmt.Sprintf("6 requests from the client pod to the ClusterIP %s:80", clusterIP))
	requests(client, clusterIP+":80", 6)
	step(fmt.Sprintf("4 requests from the client pod to the NodePort %s:%d", topology.NodeAddr, nodePort))
	requests(client, fmt.Sprintf("%s:%d", topology.NodeAddr, nodePort), 4)
	step("4 requests from the node itself to the ClusterIP")
	requests(node, clusterIP+":80", 4)

	step("killing backend1: its port now refuses, and svcproxy retries another backend")
	_ = procs[1].Process.Kill()
	_ = procs[1].Wait()
	procs = procs[:1]
	requests(client, clusterIP+":80", 4)

	time.Sleep(1500 * time.Millisecond) // the connection log is flushed every second
	step("the connection log (" + connLog + "), last 6 lines")
	showTail(connLog, 6)

	step("sandbox running; press Ctrl-C to remove everything")
	fmt.Printf(`    try, from another terminal:
      sudo ip netns exec %s curl -s http://%s/              # a pod calling the Service
      sudo ip netns exec %s curl -s http://127.0.0.1:10249/metrics | grep svcproxy_forwarder
      sudo ip netns exec %s curl -s http://127.0.0.1:10256/healthz
      sudo tail -f %s
`, client.NS, clusterIP, node.NS, node.NS, connLog)
	<-ctx.Done()
	fmt.Println()
	return nil
}

func step(s string) { fmt.Printf("\n==> %s\n", s) }

func firstNonEmpty(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

// tail is the last n lines of the file at path, indented (the sandbox's
// directory, and the file, are removed when it exits).
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "    (" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return indent(strings.Join(lines[max(0, len(lines)-n):], "\n"))
}

// steeringLine finds svcproxy's start-up line "steering with <backend>"
// in its console log at path: what steers ("nftables (table
// svcproxy-steering)", "iptables (nf_tables) + ipset") and the line's
// fields.
func steeringLine(path string) (steering, fields string) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		cols := strings.Split(line, "\t") // time, level, [logger,] message, fields
		for i, c := range cols {
			if rest, ok := strings.CutPrefix(c, "steering with "); ok {
				return rest, strings.Join(cols[i+1:], " ")
			}
		}
	}
	return "", ""
}

// showRules prints the steering rules svcproxy wrote on the node: its
// nftables table (with nft, when installed: svcproxy itself writes it over
// netlink) or its part of iptables-save -t nat.
func showRules(ctx context.Context, node *topology.Host, steering string) {
	if strings.HasPrefix(steering, "nftables") {
		if _, err := exec.LookPath("nft"); err != nil {
			fmt.Println("    (nft is not installed, so the table is not shown: svcproxy writes it over netlink without it)")
			return
		}
		fmt.Println("    nft list table ip svcproxy-steering:")
		out, err := node.Command(ctx, "nft", "list", "table", "ip", "svcproxy-steering").CombinedOutput()
		if err != nil {
			fmt.Printf("    (nft list table failed: %v: %s)\n", err, strings.TrimSpace(string(out)))
			return
		}
		fmt.Print(indent(string(out)))
		return
	}
	fmt.Println("    iptables-save -t nat, svcproxy's part:")
	if out, err := node.Command(ctx, "iptables-save", "-t", "nat").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, "SVCPROXY") {
				fmt.Println("    " + line)
			}
		}
	}
}

func indent(s string) string {
	return "      " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n      ") + "\n"
}

// startAndWait starts cmd and waits for a line containing word on stdout.
func startAndWait(cmd *exec.Cmd, word string) error {
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	ready := make(chan bool, 1)
	go func() {
		r := bufio.NewReader(out)
		line, _ := r.ReadString('\n')
		ready <- strings.Contains(line, word)
		_, _ = io.Copy(io.Discard, r)
	}()
	select {
	case ok := <-ready:
		if !ok {
			return errors.New("it exited before it was ready")
		}
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("not ready after 10s")
	}
}

func waitReady(ctx context.Context, h *topology.Host, addr string) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := get(h, addr); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("svcproxy did not start serving within 20s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func requests(h *topology.Host, addr string, n int) {
	for i := 1; i <= n; i++ {
		start := time.Now()
		name, err := get(h, addr)
		if err != nil {
			fmt.Printf("    %s → %s: FAILED: %v\n", h.Name, addr, err)
			continue
		}
		fmt.Printf("    %s → %s: served by %s in %v\n", h.Name, addr, name, time.Since(start).Round(10*time.Microsecond))
	}
}

func get(h *topology.Host, addr string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	conn, err := h.Dial(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(conn, "GET / HTTP/1.0\r\nHost: web\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(body)), err
}

// showTail prints the last n connection-log lines, each re-indented.
func showTail(path string, n int) {
	data, err := os.ReadFile(path)
	if err != nil {
		fmt.Println("    (no connection log yet:", err, ")")
		return
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for _, l := range lines {
		var v map[string]any
		if json.Unmarshal([]byte(l), &v) != nil {
			continue
		}
		fmt.Println("    " + l)
	}
}
