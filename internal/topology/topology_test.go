package topology

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Privileged tests (TestPrivileged*) need root and `ip`; they skip with the
// reason otherwise. They name namespaces testPrefix + "<pid>-...", so that
// checks of `ip netns list` look at this process's namespaces only, and the
// leak check in TestMain can tell exactly what this process left behind.

const (
	signalHelperEnv = "TOPOLOGY_TEST_SIGNAL_HELPER"
	testPrefix      = "svcproxytest-"
)

func TestMain(m *testing.M) {
	if os.Getenv(signalHelperEnv) != "" {
		signalHelper()
		return
	}
	if os.Geteuid() == 0 {
		// What crashed or timed-out runs of these tests left behind.
		if err := Cleanup(testPrefix); err != nil {
			fmt.Fprintf(os.Stderr, "cleaning up after earlier runs: %v\n", err)
		}
	}
	code := m.Run()
	if err := closeAll(false); err != nil {
		fmt.Fprintf(os.Stderr, "closing leftover topologies: %v\n", err)
		code = 1
	}
	// Leak check: no namespace made by this process may outlive it.
	if left := namespacesOf(os.Getpid()); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: namespaces left behind: %v\n", left)
		if _, err := deleteNamespaces(left); err != nil {
			fmt.Fprintf(os.Stderr, "deleting them: %v\n", err)
		}
		code = 1
	}
	os.Exit(code)
}

// namespacesOf lists the namespaces whose names say pid made them.
func namespacesOf(pid int) []string {
	re := regexp.MustCompile(`^[A-Za-z0-9._-]*?` + strconv.Itoa(pid) + `-[0-9a-f]{6}-[a-z0-9]+$`)
	var out []string
	for _, ns := range netnsList(nil) {
		if re.MatchString(ns) {
			out = append(out, ns)
		}
	}
	return out
}

// netnsList is `ip netns list`, names only.
func netnsList(t testing.TB) []string {
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		if t != nil {
			t.Fatalf("ip netns list: %v: %s", err, out)
		}
		return nil
	}
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names
}

func withPrefix(names []string, prefix string) []string {
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out
}

// ownPrefix is the start of the names of the namespaces this process makes
// with prefix: other processes' are none of its business.
func ownPrefix(prefix string) string { return prefix + strconv.Itoa(os.Getpid()) + "-" }

// existing returns those of names that `ip netns list` shows.
func existing(t testing.TB, names []string) []string {
	all := netnsList(t)
	var out []string
	for _, n := range names {
		if slices.Contains(all, n) {
			out = append(out, n)
		}
	}
	return out
}

func nsNames(topo *Topology) []string {
	var out []string
	for _, h := range topo.Hosts() {
		out = append(out, h.NS)
	}
	return out
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// serveWhoami answers every connection on l with the peer's address and a
// newline: the server's view proves there was no NAT on the way.
func serveWhoami(t *testing.T, l net.Listener) {
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s\n", c.RemoteAddr())
			c.Close()
		}
	}()
}

// whoami connects from h to addr and returns the address the server saw.
func whoami(ctx context.Context, h *Host, addr netip.AddrPort) (netip.AddrPort, error) {
	c, err := h.Dial(ctx, "tcp", addr.String())
	if err != nil {
		return netip.AddrPort{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("reading from %s: %w", addr, err)
	}
	return netip.ParseAddrPort(strings.TrimSpace(line))
}

func listenWhoami(t *testing.T, h *Host, addr netip.Addr) netip.AddrPort {
	t.Helper()
	l, err := h.Listen(testCtx(t), "tcp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		t.Fatalf("listening in %s: %v", h.Name, err)
	}
	serveWhoami(t, l)
	return l.Addr().(*net.TCPAddr).AddrPort()
}

func TestPrivilegedReachability(t *testing.T) {
	topo := NewT(t, Options{Prefix: testPrefix, Clients: 2, Backends: 3})
	ctx := testCtx(t)
	servers, servers6 := map[*Host]netip.AddrPort{}, map[*Host]netip.AddrPort{}
	for _, h := range topo.Hosts() {
		servers[h] = listenWhoami(t, h, h.Addr)
		servers6[h] = listenWhoami(t, h, h.Addr6)
	}

	type pair struct{ from, to *Host }
	var pairs []pair
	for _, h := range topo.Hosts()[1:] {
		pairs = append(pairs, pair{h, topo.Node}, pair{topo.Node, h})
	}
	for _, c := range topo.Clients {
		for _, b := range topo.Backends {
			pairs = append(pairs, pair{c, b}, pair{b, c})
		}
	}

	for _, fam := range []struct {
		name    string
		servers map[*Host]netip.AddrPort
		addr    func(*Host) netip.Addr
	}{
		{"tcp", servers, func(h *Host) netip.Addr { return h.Addr }},
		{"tcp over IPv6", servers6, func(h *Host) netip.Addr { return h.Addr6 }},
	} {
		t.Run(fam.name, func(t *testing.T) {
			for _, p := range pairs {
				got, err := whoami(ctx, p.from, fam.servers[p.to])
				if err != nil {
					t.Errorf("%s -> %s (%s): %v", p.from.Name, p.to.Name, fam.servers[p.to], err)
					continue
				}
				if got.Addr() != fam.addr(p.from) {
					t.Errorf("%s -> %s: server saw %s, want %s (no NAT)", p.from.Name, p.to.Name, got.Addr(), fam.addr(p.from))
				}
			}
		})
	}

	t.Run("udp", func(t *testing.T) {
		for _, b := range topo.Backends {
			pc, err := b.ListenPacket(ctx, "udp", netip.AddrPortFrom(b.Addr, 0).String())
			if err != nil {
				t.Fatal(err)
			}
			defer pc.Close()
			go func() {
				buf := make([]byte, 1500)
				for {
					n, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					pc.WriteTo(buf[:n], from)
				}
			}()
			for _, c := range topo.Clients {
				conn, err := c.Dial(ctx, "udp", pc.LocalAddr().String())
				if err != nil {
					t.Fatal(err)
				}
				msg := c.Name + " to " + b.Name
				conn.SetDeadline(time.Now().Add(5 * time.Second))
				buf := make([]byte, 1500)
				if _, err := conn.Write([]byte(msg)); err != nil {
					t.Errorf("%s: write: %v", msg, err)
				} else if n, err := conn.Read(buf); err != nil || string(buf[:n]) != msg {
					t.Errorf("%s: echo got %q, %v; want %q", msg, buf[:n], err, msg)
				}
				conn.Close()
			}
		}
	})

	t.Run("ping", func(t *testing.T) {
		if _, err := exec.LookPath("ping"); err != nil {
			t.Skip("skipping: no ping command (Debian package iputils-ping)")
		}
		for _, p := range pairs {
			out, err := p.from.Command(ctx, "ping", "-n", "-c1", "-W1", p.to.Addr.String()).CombinedOutput()
			if err != nil {
				t.Errorf("%s: ping %s (%s): %v\n%s", p.from.Name, p.to.Name, p.to.Addr, err, out)
			}
		}
	})
}

// TestPrivilegedTrafficCrossesNode proves clients reach backends through the
// node's IP stack: with forwarding off in the node, they do not.
func TestPrivilegedTrafficCrossesNode(t *testing.T) {
	topo := NewT(t, Options{Prefix: testPrefix, Backends: 1})
	c, b := topo.Clients[0], topo.Backends[0]
	srv := listenWhoami(t, b, b.Addr)

	out, err := topo.Node.Command(testCtx(t), "cat", "/proc/sys/net/ipv4/ip_forward").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "1" {
		t.Fatalf("node's ip_forward, read by ip netns exec: %q, %v; want 1", out, err)
	}

	setForward := func(v string) {
		t.Helper()
		if err := topo.Node.Do(func() error { return setSysctl("net/ipv4/ip_forward", v) }); err != nil {
			t.Fatal(err)
		}
	}
	setForward("0")
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	_, err = whoami(ctx, c, srv)
	cancel()
	if err == nil {
		t.Errorf("%s reached %s with forwarding off in the node", c.Name, b.Name)
	}
	setForward("1")
	if _, err := whoami(testCtx(t), c, srv); err != nil {
		t.Errorf("with forwarding back on: %v", err)
	}
}

// rootState is what the topology must never change in the caller's
// namespace: routes, rules, links, firewall rules and forwarding sysctls.
func rootState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	run := func(name string, args ...string) {
		if _, err := exec.LookPath(name); err != nil {
			return
		}
		out, err := exec.Command(name, args...).CombinedOutput()
		fmt.Fprintf(&b, "$ %s %s (err %v)\n", name, strings.Join(args, " "), err)
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "#") {
				continue // iptables-save's dated comments
			}
			line = counters.ReplaceAllString(line, "[n:n]")
			b.WriteString(expires.ReplaceAllString(line, "expires N") + "\n")
		}
	}
	run("ip", "route", "show", "table", "all")
	run("ip", "-6", "route", "show", "table", "all")
	run("ip", "rule")
	run("ip", "-6", "rule")
	run("ip", "-br", "link")
	run("ip", "-br", "addr")
	run("iptables-save")
	run("ip6tables-save")
	run("nft", "list", "ruleset")
	for _, s := range []string{
		"net/ipv4/ip_forward", "net/ipv4/conf/all/forwarding", "net/ipv4/conf/all/rp_filter",
		"net/ipv6/conf/all/forwarding",
	} {
		v, err := os.ReadFile("/proc/sys/" + s)
		fmt.Fprintf(&b, "%s = %q (err %v)\n", s, v, err)
	}
	return b.String()
}

var (
	counters = regexp.MustCompile(`\[[0-9]+:[0-9]+\]`) // iptables-save's packet:byte counts
	expires  = regexp.MustCompile(`expires [0-9]+sec`) // routes learned from router advertisements
)

func TestPrivilegedRootNamespaceUnchanged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root")
	}
	fwd, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	before := rootState(t)
	topo, err := New(Options{Prefix: testPrefix, Clients: 2, Backends: 2})
	if errors.Is(err, ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer topo.Close()
	if err := topo.AddNodeAddress(netip.MustParsePrefix("198.19.0.7/32")); err != nil {
		t.Fatal(err)
	}
	srv := listenWhoami(t, topo.Backends[1], topo.Backends[1].Addr)
	if _, err := whoami(testCtx(t), topo.Clients[1], srv); err != nil {
		t.Fatal(err)
	}
	during := rootState(t)
	if err := topo.Close(); err != nil {
		t.Fatal(err)
	}
	after := rootState(t)
	if during != before {
		t.Errorf("root namespace changed while the topology existed:\nbefore:\n%s\nduring:\n%s", before, during)
	}
	if after != before {
		t.Errorf("root namespace changed by New+Close:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if fwd2, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); string(fwd2) != string(fwd) {
		t.Errorf("root ip_forward: %q, was %q", fwd2, fwd)
	}
}

func TestPrivilegedCloseRemovesEverything(t *testing.T) {
	topo := NewT(t, Options{Prefix: testPrefix, Clients: 2, Backends: 3})
	names := nsNames(topo)
	if got := withPrefix(netnsList(t), ownPrefix(testPrefix)); !sameSet(got, names) {
		t.Fatalf("ip netns list: %v, want %v", got, names)
	}
	// A process still running in a namespace is killed, so the namespace
	// really goes away.
	sleep, waited := startSleep(t, topo.Backends[2])

	if err := topo.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := withPrefix(netnsList(t), ownPrefix(testPrefix)); len(got) > 0 {
		t.Errorf("after Close, ip netns list still has %v", got)
	}
	for _, ns := range names {
		if _, err := os.Lstat(netnsPath(ns)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v, want not exist", netnsPath(ns), err)
		}
	}
	select {
	case err := <-waited:
		if err == nil {
			t.Errorf("sleep in %s exited cleanly; want killed", topo.Backends[2].NS)
		}
	case <-time.After(10 * time.Second):
		sleep.Process.Kill()
		t.Errorf("sleep in %s still running after Close", topo.Backends[2].NS)
	}
	if err := topo.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := topo.AddNodeAddress(netip.MustParsePrefix("198.19.0.1/32")); err == nil {
		t.Error("AddNodeAddress after Close: no error")
	}
}

// startSleep starts a long sleep in h's namespace and returns once it runs
// there (ip netns exec has switched), with a channel for its Wait.
func startSleep(t *testing.T, h *Host) (*exec.Cmd, <-chan error) {
	t.Helper()
	cmd := h.Command(context.Background(), "sh", "-c", "echo in; exec sleep 300")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	line, err := bufio.NewReader(out).ReadString('\n')
	go func() { waited <- cmd.Wait() }()
	if err != nil || line != "in\n" {
		cmd.Process.Kill()
		t.Fatalf("starting sleep in %s: %q, %v", h.NS, line, err)
	}
	return cmd, waited
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func netnsInode(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func TestPrivilegedDo(t *testing.T) {
	topo := NewT(t, Options{Prefix: testPrefix, Clients: 2, Backends: 2})
	root := netnsInode(t, "/proc/self/ns/net")

	t.Run("right namespace", func(t *testing.T) {
		for _, h := range topo.Hosts() {
			want := netnsInode(t, netnsPath(h.NS))
			if want == root {
				t.Fatalf("%s has the root namespace's inode", h.NS)
			}
			var got uint64
			if err := h.Do(func() error {
				got = netnsInode(t, "/proc/thread-self/ns/net")
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("%s: inside Do the thread's namespace is inode %d, want %d", h.Name, got, want)
			}
		}
	})

	t.Run("threads switched back", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := range 64 {
			h := topo.Hosts()[i%len(topo.Hosts())]
			wg.Go(func() {
				h.Do(func() error { time.Sleep(time.Millisecond); return nil })
			})
		}
		wg.Wait()
		// Every thread of this process, Do's included, is back in the root
		// namespace.
		tasks, err := filepath.Glob("/proc/self/task/*/ns/net")
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range tasks {
			var st syscall.Stat_t
			if syscall.Stat(p, &st) != nil {
				continue // the thread exited
			}
			if st.Ino != root {
				t.Errorf("%s: namespace inode %d, want the root's %d", p, st.Ino, root)
			}
		}
	})

	t.Run("error", func(t *testing.T) {
		want := errors.New("from fn")
		if err := topo.Node.Do(func() error { return want }); err != want {
			t.Errorf("Do returned %v, want fn's error %v", err, want)
		}
		gone := &Host{Name: "gone", NS: "svcproxytest-do-no-such-namespace"}
		if err := gone.Do(func() error { t.Error("fn ran"); return nil }); err == nil || !strings.Contains(err.Error(), gone.NS) {
			t.Errorf("Do in a missing namespace: %v, want an error naming it", err)
		}
	})

	t.Run("panic", func(t *testing.T) {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v, want boom", r)
			}
		}()
		topo.Node.Do(func() error { panic("boom") })
	})
}

func TestPrivilegedNewFailsHalfway(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root")
	}
	own := ownPrefix(testPrefix)
	injected := errors.New("injected failure")
	for _, tc := range []struct {
		name string
		opts Options
		fail string // step to fail after; empty: none
	}{
		{name: "too many backends", opts: Options{Backends: MaxBackends + 1}},
		{name: "too many clients", opts: Options{Clients: 1000}},
		{name: "bad prefix", opts: Options{Prefix: "svcproxytest/half-"}},
		{name: "after namespaces", fail: "namespaces", opts: Options{Backends: 3}},
		{name: "after node", fail: "node", opts: Options{Backends: 3}},
		{name: "after a client", fail: "client0", opts: Options{Backends: 3}},
		{name: "after a backend", fail: "backend1", opts: Options{Backends: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.opts.Prefix == "" {
				tc.opts.Prefix = testPrefix
			}
			reached := false
			testHookStep = func(step string) error {
				if step == tc.fail {
					reached = true
					if n := len(withPrefix(netnsList(t), own)); n == 0 {
						t.Errorf("at step %s, no namespace exists yet", step)
					}
					return injected
				}
				return nil
			}
			defer func() { testHookStep = nil }()
			topo, err := New(tc.opts)
			if err == nil {
				topo.Close()
				t.Fatal("New succeeded")
			}
			if tc.fail != "" && (!reached || !errors.Is(err, injected)) {
				t.Errorf("New: %v (reached %s: %v); want the injected failure", err, tc.fail, reached)
			}
			if left := withPrefix(netnsList(t), own); len(left) > 0 {
				t.Errorf("New failed (%v) and left %v", err, left)
				deleteNamespaces(left)
			}
			live.Lock()
			n := len(live.topos)
			live.Unlock()
			if n != 0 {
				t.Errorf("%d topologies still registered", n)
			}
		})
	}
}

func TestPrivilegedNoDefaultRoute(t *testing.T) {
	topo := NewT(t, Options{Prefix: testPrefix, Clients: 1, Backends: 1})
	ctx := testCtx(t)
	for _, h := range topo.Hosts() {
		for _, fam := range []string{"-4", "-6"} {
			out, err := exec.CommandContext(ctx, "ip", "-n", h.NS, fam, "route", "show", "table", "all").CombinedOutput()
			if err != nil {
				t.Fatalf("%s: ip route: %v: %s", h.Name, err, out)
			}
			for _, line := range strings.Split(string(out), "\n") {
				if strings.HasPrefix(line, "default") {
					t.Errorf("%s (%s): default route %q", h.Name, fam, line)
				}
			}
		}
		// A route lookup (no packet is sent) for an address outside Range
		// or Range6 finds nothing.
		for _, outside := range []string{"203.0.113.1", "2001:db8::1"} {
			out, err := exec.CommandContext(ctx, "ip", "-n", h.NS, "route", "get", outside).CombinedOutput()
			if err == nil || !strings.Contains(string(out), "unreachable") {
				t.Errorf("%s: ip route get %s: %v: %s; want unreachable", h.Name, outside, err, out)
			}
		}
	}
}

func TestPrivilegedAddNodeAddress(t *testing.T) {
	topo := NewT(t, Options{Prefix: testPrefix, Clients: 2, Backends: 1})
	ext, ext6 := netip.MustParsePrefix("198.19.0.5/32"), netip.MustParsePrefix("fd00:19::5/128")
	for _, p := range []netip.Prefix{ext, ext6} {
		if err := topo.AddNodeAddress(p); err != nil {
			t.Fatal(err)
		}
		srv := listenWhoami(t, topo.Node, p.Addr())
		for _, h := range topo.Hosts()[1:] {
			want := h.Addr
			if p.Addr().Is6() {
				want = h.Addr6
			}
			got, err := whoami(testCtx(t), h, srv)
			if err != nil {
				t.Errorf("%s -> %s: %v", h.Name, srv, err)
			} else if got.Addr() != want {
				t.Errorf("%s -> %s: server saw %s, want %s", h.Name, srv, got.Addr(), want)
			}
		}
	}
	for _, bad := range []string{"10.0.0.1/32", "198.18.2.0/24", "198.18.0.0/15", "198.16.0.0/12", "2001:db8::1/128",
		"fd00:18:2::/64", "fd00:18::/31", "fd00::/8", "::ffff:198.19.0.6/128"} {
		if err := topo.AddNodeAddress(netip.MustParsePrefix(bad)); err == nil {
			t.Errorf("AddNodeAddress(%s): no error", bad)
		}
	}
	if err := topo.AddNodeAddress(ext); err == nil || !strings.Contains(err.Error(), "already") {
		t.Errorf("adding %s twice: %v; want ip's error", ext, err)
	}
}

func TestPrivilegedIPErrors(t *testing.T) {
	topo := NewT(t, Options{Prefix: testPrefix, Clients: -1, Backends: -1})
	err := ipBatch(topo.Node.NS, "link set lo up\nlink set nosuchdev0 up\n")
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"-n " + topo.Node.NS, `at "link set nosuchdev0 up"`, "nosuchdev0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if errors.Is(err, ErrUnsupported) {
		t.Errorf("error %q wraps ErrUnsupported", err)
	}
}

func TestPrivilegedCleanup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root")
	}
	prefix := fmt.Sprintf("svcproxytest-clean%d-", os.Getpid()) // apart from concurrent runs
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	deadPID := dead.Process.Pid
	if pidAlive(deadPID) {
		t.Skipf("pid %d reused already", deadPID)
	}
	stale := []string{
		fmt.Sprintf("%s%d-abc123-node", prefix, deadPID),
		fmt.Sprintf("%s%d-abc123-backend12", prefix, deadPID),
	}
	keep := []string{
		fmt.Sprintf("%s%d-abc123-node", prefix, os.Getpid()),   // a live run's
		fmt.Sprintf("%s%d-abc123-router", prefix, deadPID),     // not a role New makes
		fmt.Sprintf("%s%d-abc12-node", prefix, deadPID),        // not the suffix pattern
		fmt.Sprintf("other-%s%d-abc123-node", prefix, deadPID), // another prefix
	}
	var b strings.Builder
	for _, ns := range slices.Concat(stale, keep) {
		fmt.Fprintf(&b, "netns add %s\n", ns)
	}
	t.Cleanup(func() {
		if _, err := deleteNamespaces(slices.Concat(stale, keep)); err != nil {
			t.Error(err)
		}
	})
	if err := ipBatch("", b.String()); err != nil {
		t.Fatal(err)
	}
	sleep, waited := startSleep(t, &Host{NS: stale[0]})

	if err := Cleanup(prefix); err != nil {
		t.Fatal(err)
	}
	got := netnsList(t)
	for _, ns := range stale {
		if slices.Contains(got, ns) {
			t.Errorf("Cleanup left %s", ns)
		}
	}
	for _, ns := range keep {
		if !slices.Contains(got, ns) {
			t.Errorf("Cleanup deleted %s", ns)
		}
	}
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		sleep.Process.Kill()
		t.Error("the process in a deleted namespace is still running")
	}
}

// TestPrivilegedSignal interrupts a process holding a topology, as Ctrl-C
// would: it must delete its namespaces and then die of the signal.
func TestPrivilegedSignal(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root")
	}
	ctx := testCtx(t)
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), signalHelperEnv+"=1")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("helper: %v", err)
	}
	names := strings.Fields(line)
	if len(names) == 0 || names[0] == "skip" {
		cmd.Wait()
		t.Skipf("helper: %s", line)
	}
	if got := existing(t, names); !sameSet(got, names) {
		t.Errorf("before the signal: namespaces %v, want %v", got, names)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGINT {
		t.Errorf("helper ended with %v; want death by SIGINT", err)
	}
	if left := existing(t, names); len(left) > 0 {
		t.Errorf("after SIGINT: namespaces left: %v", left)
		deleteNamespaces(left)
	}
}

// signalHelper builds a topology, prints its namespace names and waits to be
// interrupted.
func signalHelper() {
	topo, err := New(Options{Prefix: testPrefix, Backends: 2})
	if err != nil {
		fmt.Printf("skip %v\n", err)
		os.Exit(0)
	}
	fmt.Println(strings.Join(nsNames(topo), " "))
	time.Sleep(time.Minute)
	fmt.Fprintln(os.Stderr, "signal helper: no signal came")
	topo.Close()
	os.Exit(3)
}

// Unprivileged tests.

func TestOptions(t *testing.T) {
	for _, tc := range []struct {
		in      Options
		want    Options
		wantErr string
	}{
		{in: Options{}, want: Options{Prefix: "svcproxy-", Clients: 1, Backends: 2}},
		{in: Options{Prefix: "x.y_z-", Clients: -1, Backends: 254}, want: Options{Prefix: "x.y_z-", Clients: 0, Backends: 254}},
		{in: Options{Clients: 255}, wantErr: "255 clients"},
		{in: Options{Backends: 255}, wantErr: "255 backends"},
		{in: Options{Prefix: "a b"}, wantErr: "prefix"},
		{in: Options{Prefix: "../x"}, wantErr: "prefix"},
		{in: Options{Prefix: strings.Repeat("p", 65)}, wantErr: "prefix"},
	} {
		got, err := tc.in.withDefaults()
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%+v: err %v, want one saying %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%+v: got %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestPlan(t *testing.T) {
	o, err := Options{Clients: 2, Backends: MaxBackends}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	topo := plan(o, "svcproxy-42-abcdef")
	for _, tc := range []struct {
		h                           *Host
		name, ns, addr, addr6, link string
	}{
		{topo.Node, "node", "svcproxy-42-abcdef-node", "198.18.0.1", "fd00:18::1", ""},
		{topo.Clients[0], "client0", "svcproxy-42-abcdef-client0", "198.18.1.1", "fd00:18:1::1", "c0"},
		{topo.Clients[1], "client1", "svcproxy-42-abcdef-client1", "198.18.1.2", "fd00:18:1::2", "c1"},
		{topo.Backends[0], "backend0", "svcproxy-42-abcdef-backend0", "198.18.2.1", "fd00:18:2::1", "b0"},
		{topo.Backends[253], "backend253", "svcproxy-42-abcdef-backend253", "198.18.2.254", "fd00:18:2::fe", "b253"},
	} {
		got := *tc.h
		want := Host{Name: tc.name, NS: tc.ns, Addr: netip.MustParseAddr(tc.addr), Addr6: netip.MustParseAddr(tc.addr6), NodeLink: tc.link}
		if got != want {
			t.Errorf("got %+v, want %+v", got, want)
		}
	}
	if n := len(topo.Hosts()); n != 1+2+MaxBackends {
		t.Errorf("%d hosts", n)
	}
	seen := map[netip.Addr]bool{}
	for _, h := range topo.Hosts() {
		if !Range.Contains(h.Addr) || FreeRange.Contains(h.Addr) || seen[h.Addr] {
			t.Errorf("%s: address %s outside Range, inside FreeRange or taken", h.Name, h.Addr)
		}
		if !Range6.Contains(h.Addr6) || FreeRange6.Contains(h.Addr6) || seen[h.Addr6] {
			t.Errorf("%s: address %s outside Range6, inside FreeRange6 or taken", h.Name, h.Addr6)
		}
		seen[h.Addr], seen[h.Addr6] = true, true
		if len(h.NodeLink) > 15 {
			t.Errorf("%s: link name %q too long for the kernel", h.Name, h.NodeLink)
		}
		if !nameRE("svcproxy-").MatchString(h.NS) {
			t.Errorf("%s: Cleanup's pattern does not match %s", h.Name, h.NS)
		}
	}
}

func TestNamePattern(t *testing.T) {
	re := nameRE("svcproxy-")
	for name, want := range map[string]bool{
		"svcproxy-4242-a1b2c3-node":      true,
		"svcproxy-4242-a1b2c3-client0":   true,
		"svcproxy-4242-a1b2c3-backend17": true,
		"svcproxy-4242-a1b2c3-router":    false,
		"svcproxy-4242-a1b2c-node":       false,
		"svcproxy-0042-a1b2c3-node":      false,
		"svcproxy-x-a1b2c3-node":         false,
		"xsvcproxy-4242-a1b2c3-node":     false,
		"svcproxy-4242-A1B2C3-node":      false,
		"svcproxy-node":                  false,
	} {
		if got := re.MatchString(name); got != want {
			t.Errorf("%s: match %v, want %v", name, got, want)
		}
	}
}

func TestUnsupported(t *testing.T) {
	if !errors.Is(ErrUnsupported, errors.ErrUnsupported) {
		t.Error("ErrUnsupported does not match errors.ErrUnsupported")
	}
	for msg, want := range map[string]bool{
		"mount --make-shared /run/netns failed: Operation not permitted": true,
		"Error: Unknown device type.\nCommand failed -:2":                true,
		"Cannot find device \"nosuchdev0\"":                              false,
		"RTNETLINK answers: File exists":                                 false,
	} {
		if got := unsupportedMsg(msg); got != want {
			t.Errorf("%q: unsupported %v, want %v", msg, got, want)
		}
	}
	if os.Geteuid() == 0 {
		return
	}
	_, err := New(Options{Prefix: testPrefix})
	if !errors.Is(err, ErrUnsupported) {
		t.Errorf("New as non-root: %v, want ErrUnsupported", err)
	}
}

// BenchmarkPrivilegedNew measures New+Close, sized by the number of backends.
func BenchmarkPrivilegedNew(b *testing.B) {
	for _, n := range []int{2, 32, MaxBackends} {
		b.Run(fmt.Sprintf("backends=%d", n), func(b *testing.B) {
			for b.Loop() {
				topo := NewT(b, Options{Prefix: testPrefix, Backends: n})
				if err := topo.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
