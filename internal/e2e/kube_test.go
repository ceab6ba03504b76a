package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/svcproxy/svcproxy/internal/proctest"
	"github.com/svcproxy/svcproxy/internal/topology"
)

// KubeconfigEnv names the admin kubeconfig of a real API server whose
// --service-cluster-ip-range is topology.FreeRange. The test module's
// TestPrivilegedKubeTopology (cd test && go test -run
// TestPrivilegedKubeTopology ./e2e) builds and starts one and runs the
// tests here with it set.
const KubeconfigEnv = "SVCPROXY_E2E_KUBECONFIG"

const kubeSyncInterval = 200 * time.Millisecond // svcproxy's --min-sync-period here

// kubeCluster is svcproxy, fed by a real API server, steering a ClusterIP
// on the node namespace of a topology, with real backends and a client.
type kubeCluster struct {
	*cluster
	client kubernetes.Interface
	ns     string
}

func newKubeCluster(t *testing.T, backends int) *kubeCluster {
	t.Helper()
	kubeconfig := os.Getenv(KubeconfigEnv)
	if kubeconfig == "" {
		t.Skipf("skipping: %s is not set; `cd test && go test -run TestPrivilegedKubeTopology ./e2e` starts a real API server and runs this", KubeconfigEnv)
	}
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	help, _ := exec.Command(bins.svcproxy, "--help").CombinedOutput()
	if !bytes.Contains(help, []byte("-kubeconfig")) {
		t.Skip("skipping: this svcproxy has no --kubeconfig flag yet (source/kube is not wired into cmd/svcproxy)")
	}
	proctest.NeedTools(t, "iptables", "iptables-save", "ipset")
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	topo := topology.NewT(t, topology.Options{Backends: backends, Clients: 1})
	c := &kubeCluster{cluster: &cluster{t: t, topo: topo, dir: t.TempDir()}, client: client}
	if out, err := topo.Node.Command(context.Background(), "ip", "route", "add", topology.FreeRange.String(), "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("adding the Service route: %v: %s", err, out)
	}
	// The API server listens on this process's loopback; svcproxy runs in
	// the node namespace. Relay the same address there, so the kubeconfig
	// (and the serving certificate's 127.0.0.1) is valid as it is.
	u, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	relayInto(t, topo.Node, u.Host)
	for i, h := range topo.Backends {
		c.startBackend(h, fmt.Sprintf("backend%d", i))
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	c.ns = fmt.Sprintf("e2e-kube-%x", b)
	ctx := context.Background()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The node's Node, which svcproxy reads at start (zone, proxy-mode
	// annotation, its InternalIP, which REDIRECT steering DNATs to) and
	// watches (deletion, a new InternalIP).
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node"}}
	if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	c.setNodeIP(topology.NodeAddr)
	t.Cleanup(func() {
		_ = client.DiscoveryV1().EndpointSlices(c.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		if list, err := client.CoreV1().Services(c.ns).List(ctx, metav1.ListOptions{}); err == nil {
			for _, s := range list.Items {
				_ = client.CoreV1().Services(c.ns).Delete(ctx, s.Name, metav1.DeleteOptions{})
			}
		}
	})
	c.startKubeProxy(kubeconfig, string(help))
	return c
}

// relayInto accepts connections on addr inside h's namespace and relays
// each to addr as this process reaches it.
func relayInto(t *testing.T, h *topology.Host, addr string) {
	t.Helper()
	ln, err := h.Listen(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatalf("relaying the API server into %s: %v", h.Name, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", addr)
				if err != nil {
					return
				}
				defer up.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
				go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
				<-done
			}()
		}
	}()
}

func (c *kubeCluster) startKubeProxy(kubeconfig, help string) {
	c.t.Helper()
	args := []string{
		"--kubeconfig", kubeconfig,
		"--steering=redirect",
		"--steering-backend=iptables", // as newCluster: the suite inspects iptables rules and ipsets
		"--hostname-override", "node",
		"--min-sync-period", kubeSyncInterval.String(),
		"--conn-log", filepath.Join(c.dir, "connections.log"),
		"--metrics-bind-address", "127.0.0.1:10249",
		"--healthz-bind-address", "127.0.0.1:10256",
		"--drain-timeout", "2s",
		"--log-level", "debug",
	}
	if strings.Contains(help, "-pid-file") {
		args = append(args, "--pid-file", c.pidFile(), "--handover-socket", filepath.Join(c.dir, "handover.sock"))
	}
	if strings.Contains(help, "-proxy-mode") {
		args = append(args, "--proxy-mode", "userspace")
	}
	c.launch(bins.svcproxy, args...)
}

// setNodeIP makes ip the Node's only InternalIP.
func (c *kubeCluster) setNodeIP(ip netip.Addr) {
	c.t.Helper()
	ctx := context.Background()
	node, err := c.client.CoreV1().Nodes().Get(ctx, "node", metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip.String()}}
	if _, err := c.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		c.t.Fatalf("setting the Node's InternalIP: %v", err)
	}
}

func (c *kubeCluster) createService(name, clusterIP string) {
	c.t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: clusterIP,
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
	}
	if _, err := c.client.CoreV1().Services(c.ns).Create(context.Background(), svc, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// setEndpoints creates or replaces the Service's one slice: the backends
// named by index, ready, plus notReady ones listed but not ready.
func (c *kubeCluster) setEndpoints(svc string, readyIdx []int, notReadyIdx ...int) {
	c.t.Helper()
	es := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: c.ns, Name: svc + "-1", Labels: map[string]string{discovery.LabelServiceName: svc}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptrTo("http"), Protocol: ptrTo(corev1.ProtocolTCP), Port: ptrTo[int32](8080)}},
	}
	add := func(idx []int, isReady bool) {
		for _, i := range idx {
			es.Endpoints = append(es.Endpoints, discovery.Endpoint{
				Addresses:  []string{c.topo.Backends[i].Addr.String()},
				Conditions: discovery.EndpointConditions{Ready: ptrTo(isReady), Serving: ptrTo(isReady)},
				NodeName:   ptrTo("elsewhere"),
			})
		}
	}
	add(readyIdx, true)
	add(notReadyIdx, false)
	ctx := context.Background()
	slices := c.client.DiscoveryV1().EndpointSlices(c.ns)
	if old, err := slices.Get(ctx, es.Name, metav1.GetOptions{}); err == nil {
		es.ResourceVersion = old.ResourceVersion
		_, err = slices.Update(ctx, es, metav1.UpdateOptions{})
		if err != nil {
			c.t.Fatal(err)
		}
		return
	}
	if _, err := slices.Create(ctx, es, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

func ptrTo[T any](v T) *T { return &v }

// reaches sends n requests to addr from the client until the set of
// backends answering is exactly want, and returns how long that took.
func (c *kubeCluster) reaches(addr string, timeout time.Duration, want ...int) time.Duration {
	c.t.Helper()
	wantNames := map[string]bool{}
	for _, i := range want {
		wantNames[c.backends[i].name] = true
	}
	start := time.Now()
	var last string
	for time.Since(start) < timeout {
		seen := map[string]int{}
		var err error
		for k := 0; k < 6*len(want) && err == nil; k++ {
			var name string
			if name, err = c.get(c.topo.Clients[0], addr); err == nil {
				seen[name]++
			}
		}
		exact := err == nil && len(seen) == len(wantNames)
		for name := range seen {
			exact = exact && wantNames[name]
		}
		if exact {
			return time.Since(start)
		}
		last = fmt.Sprintf("reached %v (error %v)", seen, err)
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("traffic to %s did not reach exactly backends %v within %v: %s", addr, want, timeout, last)
	return 0
}

// TestPrivilegedKubeBinary: the real svcproxy binary, fed by a real API
// server, in userspace mode with REDIRECT steering: traffic through a
// ClusterIP reaches exactly the ready endpoints; scaling the slice down
// and up moves traffic within the sync interval; a Service with no
// endpoints refuses at once; a deleted Service is no longer served.
func TestPrivilegedKubeBinary(t *testing.T) {
	c := newKubeCluster(t, 3)
	const vip = "198.19.0.10"
	c.createService("web", vip)
	c.setEndpoints("web", []int{0, 1}, 2)
	took := c.reaches(vip+":80", 30*time.Second, 0, 1)
	t.Logf("svcproxy serving the API server's Service %v after it was created", took.Round(time.Millisecond))

	for _, step := range []struct {
		name  string
		ready []int
	}{
		{"scaled down", []int{1}},
		{"scaled up", []int{0, 1, 2}},
	} {
		c.setEndpoints("web", step.ready)
		took := c.reaches(vip+":80", 10*time.Second, step.ready...)
		t.Logf("%s: traffic followed in %v", step.name, took.Round(time.Millisecond))
		if took > 2*time.Second {
			t.Errorf("%s: traffic took %v to follow, want within the sync interval (%v) plus a margin", step.name, took, kubeSyncInterval)
		}
	}

	c.setEndpoints("web", nil)
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, took, err := dialTimed(c.topo.Clients[0], "tcp", vip+":80")
		if err == nil {
			conn.Close()
		} else if errors.Is(err, syscall.ECONNREFUSED) && took < 100*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no endpoints: dial %v after %v, want connection refused at once", err, took)
		}
		time.Sleep(50 * time.Millisecond)
	}

	if err := c.client.CoreV1().Services(c.ns).Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		if _, err := c.get(c.topo.Clients[0], vip+":80"); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the deleted Service still answers")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPrivilegedKubeNodeIPChange: REDIRECT steering DNATs to the Node's
// InternalIP; when the InternalIP changes, svcproxy restarts itself (a
// successor takes over through the handover socket) and steers to the new
// one, and the Service keeps answering.
func TestPrivilegedKubeNodeIPChange(t *testing.T) {
	c := newKubeCluster(t, 2)
	const vip = "198.19.0.10"
	c.createService("web", vip)
	c.setEndpoints("web", []int{0, 1})
	c.reaches(vip+":80", 30*time.Second, 0, 1)
	dnatTo := func(ip netip.Addr) bool {
		return strings.Contains(c.nodeRules(), "DNAT --to-destination "+ip.String()+":")
	}
	if !dnatTo(topology.NodeAddr) {
		t.Fatalf("steering does not DNAT to the Node's InternalIP %v:\n%s", topology.NodeAddr, c.nodeRules())
	}

	moved := netip.MustParseAddr("198.18.0.9")
	if out, err := c.topo.Node.Command(context.Background(), "ip", "addr", "add", moved.String()+"/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("adding the node's new address: %v: %s", err, out)
	}
	old := c.pid()
	c.setNodeIP(moved)
	deadline := time.Now().Add(30 * time.Second)
	for c.pid() == old || !dnatTo(moved) || dnatTo(topology.NodeAddr) {
		if time.Now().After(deadline) {
			t.Fatalf("30s after the InternalIP changed: svcproxy %d (was %d), rules:\n%s\noutput:\n%s", c.pid(), old, c.nodeRules(), c.proxyOut)
		}
		time.Sleep(100 * time.Millisecond)
	}
	successor := c.pid()
	// Once the predecessor has gone, nothing wrote its rules back, and
	// there was one restart.
	if !proctest.WaitGone(old, 15*time.Second) {
		t.Fatalf("the predecessor %d did not exit", old)
	}
	if !dnatTo(moved) || dnatTo(topology.NodeAddr) {
		t.Errorf("after the predecessor exited, the rules are:\n%s", c.nodeRules())
	}
	if c.pid() != successor {
		t.Errorf("svcproxy restarted again: %d after %d", c.pid(), successor)
	}
	c.reaches(vip+":80", 10*time.Second, 0, 1)
}
