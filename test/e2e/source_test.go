package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/svcproxy/svcproxy/lb"
)

const syncInterval = 200 * time.Millisecond // the pipelines' MinSyncPeriod

// TestPrivilegedKubeTraffic: Services and EndpointSlices created in a real
// API server → traffic through the ClusterIP reaches exactly the ready
// endpoints; scaling the slice down and up → traffic follows within the
// sync interval; serving-terminating endpoints carry traffic only when none
// is ready; deleting the Service → connections are refused.
func TestPrivilegedKubeTraffic(t *testing.T) {
	needPrivate(t)
	srv := server(t)
	ctx := context.Background()
	ns := namespace(t, srv.Client)
	var backends []*backend
	for i := 1; i <= 4; i++ {
		backends = append(backends, startBackend(t, fmt.Sprintf("backend%d", i), fmt.Sprintf("10.244.0.%d:8080", i)))
	}
	ip := func(i int) string { return fmt.Sprintf("10.244.0.%d", i) }
	p := startPipeline(t, pipelineOptions{client: srv.Client, minSyncPeriod: syncInterval, forward: true})

	const vip = "10.96.0.10:80"
	if _, err := srv.Client.CoreV1().Services(ns).Create(ctx, service(ns, "web", "10.96.0.10", 80), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	es, err := srv.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, endpointSlice(ns, "web", "web-abc", 8080,
		ready(ip(1)), ready(ip(2)), endpoint{addr: ip(3)} /* not ready */), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// follow sets the slice's endpoints and checks that traffic reaches
	// exactly want within the sync interval (plus the API's and the
	// forwarder's own latency).
	follow := func(name string, want []string, eps ...endpoint) {
		t.Helper()
		if eps != nil {
			es.Endpoints = endpointSlice(ns, "web", es.Name, 8080, eps...).Endpoints
			if es, err = srv.Client.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		took := eventually(t, name, 10*time.Second, func() error {
			seen, err := hits(vip, 24)
			if err != nil {
				return err
			}
			if !sameSet(seen, want...) {
				return notYet("traffic reached %v, want exactly %v", seen, want)
			}
			return nil
		})
		t.Logf("%s: traffic followed in %v", name, took.Round(time.Millisecond))
		if eps != nil && took > 2*time.Second {
			t.Errorf("%s: traffic took %v to follow, want within the sync interval (%v) plus a margin", name, took, syncInterval)
		}
	}
	follow("created: only the ready endpoints", []string{"backend1", "backend2"})
	follow("scaled down", []string{"backend2"}, ready(ip(2)))
	follow("scaled up", []string{"backend1", "backend2", "backend3", "backend4"}, ready(ip(1)), ready(ip(2)), ready(ip(3)), ready(ip(4)))
	follow("rolling update: ready ones only, never the terminating", []string{"backend4"},
		endpoint{ip(1), false, true, true}, endpoint{ip(2), false, true, true}, ready(ip(4)))
	follow("nothing ready: serving-terminating ones keep it up", []string{"backend1", "backend2"},
		endpoint{ip(1), false, true, true}, endpoint{ip(2), false, true, true}, endpoint{ip(4), false, false, true})

	// No endpoints at all: the frontend stays, the connection is reset or
	// refused at once (never a timeout).
	es.Endpoints = nil
	if es, err = srv.Client.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "no endpoints: refused", 10*time.Second, func() error {
		if _, err := hits(vip, 1); err == nil {
			return notYet("a request succeeded with no endpoints")
		}
		return nil
	})

	if err := srv.Client.CoreV1().Services(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "deleted: connections refused", 10*time.Second, func() error {
		err := dialable(vip)
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil
		}
		return notYet("dial %s after delete: %v", vip, err)
	})
	if p.store.Snapshot().Balancer(lb.ServicePortName{Namespace: ns, Name: "web", Port: "http"}) != nil {
		t.Error("the deleted Service is still in the store")
	}
	_ = backends
}

// TestKubeSourceSurvivesAPIOutage: while the API server is unreachable the
// store keeps the last state; once it is back the informers relist, a full
// write follows and what was deleted meanwhile is gone.
func TestKubeSourceSurvivesAPIOutage(t *testing.T) {
	srv := server(t)
	ctx := context.Background()
	ns := namespace(t, srv.Client)
	relay := startRelay(t, srv.URL[len("https://"):])
	cfg := srv.ConfigFor(srv.Token)
	cfg.Host = "https://" + relay.addr
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"stays", "goes"} {
		if _, err := srv.Client.CoreV1().Services(ns).Create(ctx, service(ns, name, fmt.Sprintf("10.96.1.%d", i+1), 80), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := srv.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, endpointSlice(ns, name, name+"-1", 8080, ready("10.244.1.1")), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	p := startPipeline(t, pipelineOptions{client: client, minSyncPeriod: syncInterval})
	stays := lb.ServicePortName{Namespace: ns, Name: "stays", Port: "http"}
	goes := lb.ServicePortName{Namespace: ns, Name: "goes", Port: "http"}
	p.waitStore(t, "both Services", 30*time.Second, func(s *lb.Snapshot) bool { return s.Balancer(stays) != nil && s.Balancer(goes) != nil })
	fullBefore := counterValue(t, p.reg, "svcproxy_kube_flushes_total", "full")

	relay.cut()
	// Meanwhile: one Service deleted, the other's endpoints changed.
	if err := srv.Client.CoreV1().Services(ns).Delete(ctx, "goes", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	es, err := srv.Client.DiscoveryV1().EndpointSlices(ns).Get(ctx, "stays-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	es.Endpoints = endpointSlice(ns, "stays", "stays-1", 8080, ready("10.244.1.2")).Endpoints
	if _, err := srv.Client.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	snap := p.store.Snapshot()
	if snap.Balancer(stays) == nil || snap.Balancer(goes) == nil {
		t.Fatal("the store lost Services while the API server was unreachable")
	}
	if got := snap.Balancer(stays).Service.Endpoints[0].Addr.String(); got != "10.244.1.1:8080" {
		t.Fatalf("endpoint changed to %s while the API server was unreachable?", got)
	}

	relay.resume()
	took := time.Now()
	p.waitStore(t, "the relist after the outage", 60*time.Second, func(s *lb.Snapshot) bool {
		b := s.Balancer(stays)
		return s.Balancer(goes) == nil && b != nil && len(b.Service.Endpoints) == 1 && b.Service.Endpoints[0].Addr.String() == "10.244.1.2:8080"
	})
	t.Logf("state converged %v after the API server came back", time.Since(took).Round(time.Millisecond))
	if got := counterValue(t, p.reg, "svcproxy_kube_flushes_total", "full"); got <= fullBefore {
		t.Errorf("no full write after the watch recovered (full flushes %v → %v)", fullBefore, got)
	}
	if got := counterValue(t, p.reg, "svcproxy_kube_watch_errors_total", ""); got == 0 {
		t.Error("no watch error counted during the outage")
	}
}

// counterValue sums the metric name's series, restricted to those with a
// label value of label (any label) unless label is "".
func counterValue(t testing.TB, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			if label != "" && !hasLabelValue(m, label) {
				continue
			}
			if m.Counter != nil {
				sum += m.Counter.GetValue()
			}
		}
	}
	return sum
}

func hasLabelValue(m *dto.Metric, v string) bool {
	for _, l := range m.Label {
		if l.GetValue() == v {
			return true
		}
	}
	return false
}

// relay is a TCP relay in front of the API server that can be cut (every
// connection closed, new ones refused) and resumed on the same address.
type relay struct {
	t      testing.TB
	listen func(addr string) (net.Listener, error)
	addr   string
	target string

	mu    sync.Mutex
	ln    net.Listener // nil while cut
	conns map[net.Conn]bool
}

// startRelay relays a port on this process's loopback to target.
func startRelay(t testing.TB, target string) *relay {
	return startRelayOn(t, "127.0.0.1:0", target, func(addr string) (net.Listener, error) { return net.Listen("tcp", addr) })
}

// startRelayOn relays what listen accepts at addr to target (as this
// process reaches it).
func startRelayOn(t testing.TB, addr, target string, listen func(addr string) (net.Listener, error)) *relay {
	r := &relay{t: t, listen: listen, addr: addr, target: target, conns: map[net.Conn]bool{}}
	r.resume()
	t.Cleanup(r.cut)
	return r
}

func (r *relay) resume() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	ln, err := r.listen(r.addr)
	if err != nil {
		r.t.Fatalf("relay: %v", err)
	}
	r.ln, r.addr = ln, ln.Addr().String()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go r.pipe(c)
		}
	}()
}

func (r *relay) pipe(c net.Conn) {
	defer c.Close()
	up, err := net.DialTimeout("tcp", r.target, 5*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	r.mu.Lock()
	if r.ln == nil { // cut meanwhile
		r.mu.Unlock()
		return
	}
	r.conns[c], r.conns[up] = true, true
	r.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
	r.mu.Lock()
	delete(r.conns, c)
	delete(r.conns, up)
	r.mu.Unlock()
}

func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln != nil {
		r.ln.Close()
		r.ln = nil
	}
	for c := range r.conns {
		c.Close()
	}
}
