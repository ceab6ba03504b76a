package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/svcproxy/svcproxy/internal/proctest"
	"github.com/svcproxy/svcproxy/internal/topology"
	"github.com/svcproxy/svcproxy/test/apiserver"
)

var outageFlag = flag.Duration("outage", 60*time.Second, "how long TestPrivilegedKubeAPIServerOutage keeps svcproxy's kube-apiserver killed, under load")

// The outage test's Services: VIPs in topology.FreeRange (the API server's
// Service range here), each on its own backend port so the backends can
// count each Service's connections.
const (
	outageWebVIP  = "198.19.0.10" // backends 0, 1, 2; backend 2 leaves during the outage
	outageGoneVIP = "198.19.0.11" // backends 0, 1; deleted during the outage
	outageNewVIP  = "198.19.0.12" // backends 1, 2; created during the outage

	outageWebPort  = 8080
	outageGonePort = 8081
	outageNewPort  = 8082

	// The reflectors' backoff (client-go's NewReflector): 800ms doubling
	// to a 30s cap, each wait jittered by up to +100%; see
	// convergenceBound.
	reflectorBackoffInitial = 800 * time.Millisecond
	reflectorBackoffCap     = 30 * time.Second
	// What converging takes besides waiting out the backoff: the relist,
	// the store write, programming ipsets and the forwarder, on a busy
	// two-core machine.
	convergeMargin = 15 * time.Second
)

// TestPrivilegedKubeAPIServerOutage: the real svcproxy binary (userspace
// mode, REDIRECT steering) on the node namespace of a topology, fed by a
// real kube-apiserver through --kubeconfig. Under steady load through two
// ClusterIPs (several new connections every 10ms, plus long-lived echo
// streams checked byte for byte) svcproxy's kube-apiserver is SIGKILLed
// and kept down for -outage (etcd stays up). Meanwhile a second
// kube-apiserver on the same etcd, as in an HA control plane, changes
// things svcproxy cannot see: one endpoint leaves a Service, a Service is
// created, another deleted. Not one connection fails during the outage
// and svcproxy keeps serving its last state without exiting. Then the
// first kube-apiserver comes back at the same address, and within
// client-go's reflector backoff plus a margin (see convergenceBound: up to
// two minutes after a one-minute outage) svcproxy converges: the removed
// endpoint gets no new connections, the new Service answers and the
// deleted one no longer does.
func TestPrivilegedKubeAPIServerOutage(t *testing.T) {
	needPrivate(t)
	proctest.NeedTools(t, "iptables", "ipset")
	bins, err := buildBinaries(t)
	if err != nil {
		t.Skipf("skipping: kube-apiserver and etcd cannot be built here: %v", err)
	}
	proxyBin := buildSvcproxy(t)
	topo := topology.NewT(t, topology.Options{Backends: 3, Clients: 1})
	ctx := context.Background()
	srv, err := apiserver.Start(ctx, bins, apiserver.Options{ServiceCIDR: topology.FreeRange.String(), Logf: t.Logf})
	if err != nil {
		t.Fatalf("starting the API server: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("API server logs:\n%s", srv.Dump())
		}
		_ = srv.Stop()
	})

	backends := make([]*outageBackend, len(topo.Backends))
	for i, h := range topo.Backends {
		backends[i] = startOutageBackend(t, h, fmt.Sprintf("backend%d", i), outageWebPort, outageGonePort, outageNewPort)
	}
	ep := func(i int) endpoint { return ready(topo.Backends[i].Addr.String()) }

	// The objects, through the API server svcproxy will use.
	c := srv.Client
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	ns := fmt.Sprintf("e2e-outage-%x", b)
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		name, vip string
		port      int32
		eps       []endpoint
	}{
		{"web", outageWebVIP, outageWebPort, []endpoint{ep(0), ep(1), ep(2)}},
		{"gone", outageGoneVIP, outageGonePort, []endpoint{ep(0), ep(1)}},
	} {
		if _, err := c.CoreV1().Services(ns).Create(ctx, service(ns, s.name, s.vip, 80), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.DiscoveryV1().EndpointSlices(ns).Create(ctx, endpointSlice(ns, s.name, s.name+"-1", s.port, s.eps...), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	proxy := startOutageProxy(t, topo, proxyBin, srv)
	client := topo.Clients[0]
	// The client closes first, so each of its connections waits a minute
	// in TIME_WAIT: ~400 a second to one ClusterIP would nearly use up
	// the default 28,232 ephemeral ports. Widen them in its namespace.
	if out, err := client.Command(ctx, "sysctl", "-w", "net.ipv4.ip_local_port_range=1024 65535").CombinedOutput(); err != nil {
		t.Fatalf("widening the client's ephemeral ports: %v: %s", err, out)
	}
	web, gone, fresh := outageWebVIP+":80", outageGoneVIP+":80", outageNewVIP+":80"
	start := time.Now()
	for _, vip := range []string{web, gone} {
		eventually(t, "svcproxy serving "+vip, 30*time.Second, func() error { _, err := outageGet(client, vip); return err })
	}
	t.Logf("svcproxy serving both Services %v after it started", time.Since(start).Round(time.Millisecond))
	if seen := outageSpread(t, client, web, 30); len(seen) != 3 {
		t.Fatalf("web before the outage reached %v, want all three backends", seen)
	}

	// Steady load: new connections through both ClusterIPs, and long-lived
	// echo streams through web.
	webLoad := startOutageLoad(t, client, web, 4, 10*time.Millisecond)
	goneLoad := startOutageLoad(t, client, gone, 1, 10*time.Millisecond)
	var streams []*outageStream
	for i := 0; i < 3; i++ {
		streams = append(streams, startOutageStream(t, client, web))
	}
	time.Sleep(2 * time.Second)
	versionBefore := proxy.metric(t, "svcproxy_forwarder_snapshot_version")
	watchErrorsBefore := proxy.metric(t, "svcproxy_kube_watch_errors_total")
	unreachableBefore := proxy.metric(t, `svcproxy_kube_rest_client_requests_total{code="<error>"}`)
	fullBefore := proxy.metric(t, `svcproxy_kube_flushes_total{type="full"}`)

	// The outage.
	webAtKill, goneAtKill := webLoad.snapshot(), goneLoad.snapshot()
	killed := time.Now()
	proxy.relay.cut()
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver killed (SIGKILL); etcd stays up; back in %v", *outageFlag)
	peer, err := srv.StartPeer(ctx)
	if err != nil {
		t.Fatalf("starting a second kube-apiserver: %v", err)
	}
	pc := peer.Client
	es, err := pc.DiscoveryV1().EndpointSlices(ns).Get(ctx, "web-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	es.Endpoints = endpointSlice(ns, "web", "web-1", outageWebPort, ep(0), ep(1)).Endpoints
	if _, err := pc.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("removing backend2 from web through the peer: %v", err)
	}
	if _, err := pc.CoreV1().Services(ns).Create(ctx, service(ns, "new", outageNewVIP, 80), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.DiscoveryV1().EndpointSlices(ns).Create(ctx, endpointSlice(ns, "new", "new-1", outageNewPort, ep(1), ep(2)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := pc.CoreV1().Services(ns).Delete(ctx, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := pc.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "gone-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	t.Logf("changes made through the peer kube-apiserver %v into the outage", changed.Sub(killed).Round(time.Millisecond))
	web2AtChange := backends[2].count(outageWebPort)

	// Until the outage ends svcproxy serves what it last knew: it is up,
	// its snapshot does not move, backend2 still gets web's connections
	// and the new Service is not served.
	for time.Since(killed) < *outageFlag {
		proxy.Alive(t)
		time.Sleep(min(time.Second, *outageFlag-time.Since(killed)))
	}
	if err := peer.Stop(); err != nil {
		t.Errorf("stopping the peer: %v", err)
	}
	proxy.Alive(t)
	if v := proxy.metric(t, "svcproxy_forwarder_snapshot_version"); v != versionBefore {
		t.Errorf("the forwarder's snapshot moved from version %v to %v while the API server was down", versionBefore, v)
	}
	if n := backends[2].count(outageWebPort); n == web2AtChange {
		t.Errorf("backend2 got no web connections after it left the slice while the API server was down: svcproxy should have kept its last state")
	}
	if _, err := outageGet(client, fresh); err == nil {
		t.Errorf("the Service created during the outage answered before svcproxy's API server was back")
	}
	goneLoad.stop()
	for i, s := range streams {
		s.stop()
		if s.err != nil {
			t.Errorf("long-lived stream %d (to %s) broke during the outage after %d bytes echoed: %v", i, s.backend, s.bytes, s.err)
		}
	}
	webAtBack := webLoad.snapshot()

	// The relay comes back once the server is ready; until then its
	// address refuses connections in the node's namespace.
	if err := srv.Restart(ctx); err != nil {
		t.Fatalf("restarting kube-apiserver: %v", err)
	}
	proxy.relay.resume()
	back := time.Now()
	down := back.Sub(killed)
	bound := convergenceBound(down)
	t.Logf("kube-apiserver back at %s after %v down; convergence bound %v", srv.URL, down.Round(time.Millisecond), bound)

	// Converging: each of the three changes takes effect.
	var newAt, goneAt, webAt time.Duration
	prev2, prevOK := backends[2].count(outageWebPort), webLoad.snapshot().ok
	deadline := back.Add(bound)
	for newAt == 0 || goneAt == 0 || webAt == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("not converged %v after the API server came back: new Service served after %v, deleted one gone after %v, backend2 out of web after %v (0: not yet)",
				bound, newAt, goneAt, webAt)
		}
		proxy.Alive(t)
		time.Sleep(200 * time.Millisecond)
		since := time.Since(back)
		if newAt == 0 {
			if _, err := outageGet(client, fresh); err == nil {
				newAt = since
			}
		}
		// Refused would mean the Service is still there, its endpoints
		// gone (the slices' relist came first); once the Service is gone
		// its ClusterIP is not steered at all.
		if goneAt == 0 {
			if _, err := outageDial(client, gone); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
				goneAt = since
			}
		}
		// While backend2 is in web's pool it gets a third of web's load:
		// 30 connections through web and none for it means it has left.
		if n, ok := backends[2].count(outageWebPort), webLoad.snapshot().ok; webAt == 0 && n == prev2 && ok-prevOK >= 30 {
			webAt = since
		} else if n != prev2 {
			prev2, prevOK = n, ok
		}
	}
	converged := max(newAt, goneAt, webAt)
	t.Logf("converged %v after the API server came back (new Service served after %v, deleted one unsteered after %v, backend2 out of web after %v)",
		converged.Round(time.Millisecond), newAt.Round(time.Millisecond), goneAt.Round(time.Millisecond), webAt.Round(time.Millisecond))
	time.Sleep(time.Second) // web's load, on the converged state
	webLoad.stop()

	// The figures, and zero failures.
	wl, gl := webLoad.snapshot(), goneLoad.snapshot()
	duringOutage := webAtBack.ok - webAtKill.ok + gl.ok - goneAtKill.ok
	t.Logf("load: %d connections through web (%d failed, %d slower than 1s, slowest %v), %d through the deleted Service until the API server came back (%d failed); %d through both while it was down (%v, %.0f a second, %d failed)",
		wl.ok+wl.failed, wl.failed, wl.slow, wl.slowest.Round(time.Millisecond), gl.ok+gl.failed, gl.failed,
		duringOutage, down.Round(time.Millisecond), float64(duringOutage)/down.Seconds(), webAtBack.failed-webAtKill.failed+gl.failed-goneAtKill.failed)
	for i, s := range streams {
		t.Logf("long-lived stream %d to %s: %d bytes echoed byte for byte", i, s.backend, s.bytes)
	}
	if webAtBack.failed+gl.failed > 0 {
		t.Errorf("%d connections failed before the API server came back (web %d, the deleted Service %d), want none; first errors: %s",
			webAtBack.failed+gl.failed, webAtBack.failed, gl.failed, strings.Join(append(webLoad.firstErrors(), goneLoad.firstErrors()...), "; "))
	}
	// After it, backend2 leaves web's pool: connections to it drain
	// (--drain-timeout 5s), new ones go elsewhere; none fails.
	if after := wl.failed - webAtBack.failed; after > 0 {
		t.Errorf("%d connections through web failed after the API server came back; first errors: %s",
			after, strings.Join(webLoad.firstErrors(), "; "))
	}
	if wl.ok-webAtBack.ok < 10 || webAtBack.ok-webAtKill.ok < 10 {
		t.Errorf("the load hardly ran: %d web connections during the outage, %d after", webAtBack.ok-webAtKill.ok, wl.ok-webAtBack.ok)
	}

	// On the converged state, sequentially: web reaches only backends 0
	// and 1; the new Service reaches 1 and 2; the deleted one is not
	// served and its backends see nothing.
	web2, gone0, gone1 := backends[2].count(outageWebPort), backends[0].count(outageGonePort), backends[1].count(outageGonePort)
	if seen := outageSpread(t, client, web, 30); !sameSet(seen, "backend0", "backend1") {
		t.Errorf("web after the outage reached %v, want backend0 and backend1", seen)
	}
	if n := backends[2].count(outageWebPort); n != web2 {
		t.Errorf("backend2 got %d new web connections after it left the slice and svcproxy converged", n-web2)
	}
	if seen := outageSpread(t, client, fresh, 20); !sameSet(seen, "backend1", "backend2") {
		t.Errorf("the Service created during the outage reached %v, want backend1 and backend2", seen)
	}
	// Its ClusterIP is no longer steered: the node, which has no route
	// for the VIP range, answers network unreachable.
	for i := 0; i < 5; i++ {
		start := time.Now()
		conn, err := outageDial(client, gone)
		if err == nil {
			conn.Close()
			t.Fatal("the Service deleted during the outage still accepts connections")
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("the Service deleted during the outage is refused: svcproxy still has it, without endpoints")
		}
		if i == 0 {
			t.Logf("the deleted Service, after %v: %v", time.Since(start).Round(time.Millisecond), err)
		}
	}
	if backends[0].count(outageGonePort) != gone0 || backends[1].count(outageGonePort) != gone1 {
		t.Error("the deleted Service's backends got connections after svcproxy converged")
	}

	proxy.Alive(t)
	watchErrors := proxy.metric(t, "svcproxy_kube_watch_errors_total") - watchErrorsBefore
	full := proxy.metric(t, `svcproxy_kube_flushes_total{type="full"}`) - fullBefore
	t.Logf("svcproxy: %v watch errors counted, %v full writes after the outage, %d \"keeping the last state\" warnings logged; forwarder snapshot %v → %v",
		watchErrors, full, strings.Count(proxy.Out.String(), "keeping the last state"), versionBefore, proxy.metric(t, "svcproxy_forwarder_snapshot_version"))
	// Not asserted: client-go's reflectors retry a refused watch inside
	// their watch loop, with backoff, without telling the source's watch
	// error handler; svcproxy may count none for a whole outage. Every one
	// of those retries is a request, though, and the outage shows there.
	if unreachable := proxy.metric(t, `svcproxy_kube_rest_client_requests_total{code="<error>"}`) - unreachableBefore; unreachable == 0 {
		t.Error(`svcproxy_kube_rest_client_requests_total{code="<error>"} did not rise during the outage`)
	} else {
		t.Logf("svcproxy: %v API requests found no server during the outage", unreachable)
	}
	if failed := proxy.metric(t, `svcproxy_forwarder_connections_total{protocol="TCP",result="dial_failed"}`); failed > 0 {
		t.Errorf("svcproxy counted %v connections whose backend dials all failed", failed)
	}
}

// convergenceBound is how long after its API server returns, having been
// down for down, svcproxy may take to converge. Its informers' reflectors
// (client-go) retry a refused watch after a backoff: 800ms doubling to a
// 30s cap, each wait jittered by up to +100%. The waits already done sum
// to at least the current base less 800ms, so when the server returns the
// wait pending is at most 2*min(30s, down+800ms). The watch then resumes
// from the last resource version, which the restarted server's watch
// cache (it starts at the current one) does not hold: 410 Gone. The
// reflector relists, but only after one more backoff step, at most
// 2*min(30s, 2*(down+800ms)). After a one-minute outage that is up to two
// minutes, as for kube-proxy, which uses the same informers. Then the
// relist and the programming: convergeMargin.
func convergenceBound(down time.Duration) time.Duration {
	base := down + reflectorBackoffInitial
	return 2*min(base, reflectorBackoffCap) + 2*min(2*base, reflectorBackoffCap) + convergeMargin
}

// buildSvcproxy builds the main module's svcproxy binary (with the race
// detector) for t.
func buildSvcproxy(t *testing.T) string {
	t.Helper()
	mainModule, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "svcproxy")
	if err := proctest.Build(mainModule, bin, "./cmd/svcproxy", true); err != nil {
		t.Fatal(err)
	}
	return bin
}

// outageProxy is the svcproxy process on the topology's node.
type outageProxy struct {
	*proctest.Process
	relay *relay // the API server's address in the node's namespace, relayed to this process's loopback
	node  *topology.Host
}

// startOutageProxy starts svcproxy on topo's node with srv's admin
// kubeconfig. srv listens on this namespace's loopback; relay, on the same
// address in the node's namespace, makes the kubeconfig (and the serving
// certificate's 127.0.0.1) valid there as it is.
func startOutageProxy(t *testing.T, topo *topology.Topology, bin string, srv *apiserver.Server) *outageProxy {
	t.Helper()
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	// The Node svcproxy reads at start (zone, proxy-mode annotation) is
	// created by the caller.
	relay := startRelayOn(t, u.Host, u.Host, func(addr string) (net.Listener, error) {
		return topo.Node.Listen(context.Background(), "tcp", addr)
	})
	cmd := topo.Node.Command(context.Background(), bin,
		"--kubeconfig", srv.Kubeconfig,
		"--proxy-mode", "userspace",
		"--steering=redirect",
		"--hostname-override", "node",
		"--min-sync-period", "200ms",
		"--conn-log=",
		"--handover-socket=",
		"--metrics-bind-address", "127.0.0.1:10249",
		"--healthz-bind-address", "127.0.0.1:10256",
		"--drain-timeout", "5s",
		"--log-level", "info")
	return &outageProxy{Process: proctest.Start(t, "svcproxy", cmd), relay: relay, node: topo.Node}
}

// metric sums the series of svcproxy's /metrics whose name, or name with
// labels as exposed ({a="x",b="y"}), is name, or which have name's name and
// at least its labels.
func (p *outageProxy) metric(t *testing.T, name string) float64 {
	t.Helper()
	return proctest.Scrape(t, p.node.Dial, "http://127.0.0.1:10249/metrics").Sum(name)
}

// outageBackend listens on several ports of a backend host; each
// connection gets the backend's name and a newline, then its own bytes
// echoed until it closes. Connections are counted per port.
type outageBackend struct {
	name   string
	mu     sync.Mutex
	counts map[int]int
}

func startOutageBackend(t *testing.T, h *topology.Host, name string, ports ...int) *outageBackend {
	t.Helper()
	b := &outageBackend{name: name, counts: map[int]int{}}
	for _, port := range ports {
		ln, err := h.Listen(context.Background(), "tcp", net.JoinHostPort(h.Addr.String(), strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("backend %s: %v", name, err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				b.mu.Lock()
				b.counts[port]++
				b.mu.Unlock()
				go func() {
					defer c.Close()
					if _, err := io.WriteString(c, name+"\n"); err != nil {
						return
					}
					_, _ = io.Copy(c, c)
				}()
			}
		}()
	}
	return b
}

// count is how many connections port has accepted.
func (b *outageBackend) count(port int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.counts[port]
}

// outageDial connects from h to addr, giving up after 3s.
func outageDial(h *topology.Host, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return h.Dial(ctx, "tcp", addr)
}

// outageGet opens a connection from h to addr, reads the backend's name
// and closes.
func outageGet(h *topology.Host, addr string) (string, error) {
	conn, err := outageDial(h, addr)
	if err != nil {
		return "", err
	}
	return readName(conn)
}

// readName reads the backend's greeting from conn, within 5s, and closes
// conn.
func readName(conn net.Conn) (string, error) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("reading the greeting: %w", err)
	}
	return strings.TrimSuffix(line, "\n"), nil
}

// outageSpread opens n connections from h to addr, one after another, and
// counts the backends that answered; any failure fails t.
func outageSpread(t *testing.T, h *topology.Host, addr string, n int) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for i := 0; i < n; i++ {
		name, err := outageGet(h, addr)
		if err != nil {
			t.Fatalf("connection %d of %d to %s: %v", i+1, n, addr, err)
		}
		seen[name]++
	}
	return seen
}

// outageLoad opens connections to addr from a client, each worker one
// every interval (or as soon as the previous one is done, if that takes
// longer), each connection reading the backend's greeting then closing.
type outageLoad struct {
	addr string
	quit chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	figures outageFigures
	errs    []string // the first few
}

type outageFigures struct {
	ok, failed, slow int
	slowest          time.Duration
}

func startOutageLoad(t *testing.T, h *topology.Host, addr string, workers int, interval time.Duration) *outageLoad {
	l := &outageLoad{addr: addr, quit: make(chan struct{})}
	for i := 0; i < workers; i++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			// The whole loop runs on a thread in the client's namespace:
			// one setns per worker, not two per connection.
			err := h.Do(func() error {
				tick := time.NewTicker(interval)
				defer tick.Stop()
				var d net.Dialer
				for {
					select {
					case <-l.quit:
						return nil
					case <-tick.C:
					}
					start := time.Now()
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					conn, err := d.DialContext(ctx, "tcp", addr)
					cancel()
					if err == nil {
						_, err = readName(conn)
					}
					l.record(time.Since(start), err)
				}
			})
			if err != nil {
				t.Errorf("load on %s: %v", addr, err)
			}
		}()
	}
	t.Cleanup(l.stop)
	return l
}

func (l *outageLoad) record(took time.Duration, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := &l.figures
	if err != nil {
		f.failed++
		if len(l.errs) < 5 {
			l.errs = append(l.errs, fmt.Sprintf("%s: %v", time.Now().Format("15:04:05.000"), err))
		}
		return
	}
	f.ok++
	if took > time.Second {
		f.slow++
	}
	f.slowest = max(f.slowest, took)
}

func (l *outageLoad) snapshot() outageFigures {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.figures
}

func (l *outageLoad) firstErrors() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.errs...)
}

// stop stops the workers and waits for their last connections.
func (l *outageLoad) stop() {
	select {
	case <-l.quit:
	default:
		close(l.quit)
	}
	l.wg.Wait()
}

// outageStream is one long-lived connection through a Service whose
// echoed bytes are checked, a chunk every 20ms, until stop.
type outageStream struct {
	backend string
	bytes   int64
	err     error // the first failure
	quit    chan struct{}
	done    chan struct{}
}

func startOutageStream(t *testing.T, h *topology.Host, addr string) *outageStream {
	t.Helper()
	conn, err := outageDial(h, addr)
	if err != nil {
		t.Fatalf("opening a long-lived stream to %s: %v", addr, err)
	}
	r := bufio.NewReader(conn)
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	name, err := r.ReadString('\n')
	if err != nil {
		conn.Close()
		t.Fatalf("long-lived stream to %s: reading the greeting: %v", addr, err)
	}
	s := &outageStream{backend: strings.TrimSuffix(name, "\n"), quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer conn.Close()
		out := make([]byte, 16<<10)
		in := make([]byte, len(out))
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.quit:
				return
			case <-tick.C:
			}
			_, _ = rand.Read(out)
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := conn.Write(out); err != nil {
				s.err = err
				return
			}
			if _, err := io.ReadFull(r, in); err != nil {
				s.err = err
				return
			}
			if !bytes.Equal(in, out) {
				s.err = errors.New("echoed bytes differ from those sent")
				return
			}
			s.bytes += int64(len(out))
		}
	}()
	t.Cleanup(s.stop)
	return s
}

// stop ends the stream and waits for its goroutine; err and bytes are
// final afterwards.
func (s *outageStream) stop() {
	select {
	case <-s.quit:
	default:
		close(s.quit)
	}
	<-s.done
}
