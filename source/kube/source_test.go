package kube

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap/zaptest"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/svcproxy/svcproxy/healthcheck"
	"github.com/svcproxy/svcproxy/lb"
)

type fakeHealth struct {
	mu       sync.Mutex
	queued   int
	deleting bool
}

func (h *fakeHealth) Queued() { h.mu.Lock(); h.queued++; h.mu.Unlock() }
func (h *fakeHealth) SetNodeEligible(e bool) {
	h.mu.Lock()
	h.deleting = !e
	h.mu.Unlock()
}
func (h *fakeHealth) get() (int, bool) { h.mu.Lock(); defer h.mu.Unlock(); return h.queued, h.deleting }

// fakeChanges records what Run tells a ChangeTracker, in order.
type fakeChanges struct {
	mu     sync.Mutex
	events []string
}

func (c *fakeChanges) add(e string) { c.mu.Lock(); c.events = append(c.events, e); c.mu.Unlock() }
func (c *fakeChanges) Received(endpoints bool, service string, triggered time.Time) {
	kind := "Service"
	if endpoints {
		kind = "EndpointSlice"
	}
	at := "-"
	if !triggered.IsZero() {
		at = triggered.UTC().Format(time.RFC3339Nano)
	}
	c.add(fmt.Sprintf("received %s %s %s", kind, service, at))
}
func (c *fakeChanges) Cut()                   { c.add("cut") }
func (c *fakeChanges) Written(version uint64) { c.add(fmt.Sprintf("written %d", version)) }

// take returns and forgets the events so far.
func (c *fakeChanges) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.events
	c.events = nil
	return e
}

type harness struct {
	t       *testing.T
	client  *fake.Clientset
	store   *lb.Store
	metrics *Metrics
	health  *fakeHealth
	changes *fakeChanges
	nodes   chan *v1.Node
	cancel  context.CancelFunc
	done    chan error
}

func start(t *testing.T, objs ...runtime.Object) *harness {
	t.Helper()
	return startWith(t, nil, objs...)
}

// startWith is start with edit applied to the Options.
func startWith(t *testing.T, edit func(*Options), objs ...runtime.Object) *harness {
	t.Helper()
	h := &harness{
		t:       t,
		client:  fake.NewClientset(objs...),
		store:   lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: "node-a"}}),
		metrics: NewMetrics(prometheus.NewRegistry()),
		health:  &fakeHealth{},
		changes: &fakeChanges{},
		nodes:   make(chan *v1.Node, 16),
		done:    make(chan error, 1),
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	opts := Options{
		Client: h.client, NodeName: "node-a",
		Logger: zaptest.NewLogger(t), Metrics: h.metrics, Health: h.health, Changes: h.changes,
		OnNode: func(n *v1.Node) {
			select {
			case h.nodes <- n:
			default:
			}
		},
	}
	if edit != nil {
		edit(&opts)
	}
	go func() { h.done <- Run(ctx, opts, h.store) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-h.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return within 5s of cancel")
		}
	})
	return h
}

// waitFor polls the Store until cond holds.
func (h *harness) waitFor(what string, cond func(*lb.Snapshot) bool) *lb.Snapshot {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		snap := h.store.Snapshot()
		if cond(snap) {
			return snap
		}
		if time.Now().After(deadline) {
			var names []string
			for _, b := range snap.Balancers() {
				names = append(names, fmt.Sprintf("%v%v", b.Service.Name, endpointsOf(b)))
			}
			h.t.Fatalf("timed out waiting for %s; store has %v", what, names)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func endpointsOf(b *lb.Balancer) []string {
	var out []string
	for _, ep := range b.Service.Endpoints {
		out = append(out, ep.Addr.String())
	}
	return out
}

func hasEndpoints(name lb.ServicePortName, want ...string) func(*lb.Snapshot) bool {
	return func(s *lb.Snapshot) bool {
		b := s.Balancer(name)
		if b == nil {
			return false
		}
		got := endpointsOf(b)
		if len(got) != len(want) {
			return false
		}
		for i := range got {
			if got[i] != want[i] {
				return false
			}
		}
		return true
	}
}

func counter(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var m dto.Metric
	_ = (<-ch).Write(&m)
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

var webHTTP = lb.ServicePortName{Namespace: "ns", Name: "web", Port: "http"}

func TestRunFollowsTheAPI(t *testing.T) {
	es := slice("web-1", discovery.AddressTypeIPv4, httpPort, ep("10.1.0.1", "", ""), ep("10.1.0.2", "-", ""))
	h := start(t, svc(), es)
	ctx := context.Background()

	// The initial sync: a Replace with ready and non-ready endpoints alike
	// (the policy, in lb, decides which are usable).
	h.waitFor("the initial sync", hasEndpoints(webHTTP, "10.1.0.1:8080", "10.1.0.2:8080"))

	// Scale up: a second slice.
	es2 := slice("web-2", discovery.AddressTypeIPv4, httpPort, ep("10.1.0.3", "", ""))
	if _, err := h.client.DiscoveryV1().EndpointSlices("ns").Create(ctx, es2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitFor("the second slice", hasEndpoints(webHTTP, "10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080"))

	// Scale down: the first slice loses an endpoint.
	es = es.DeepCopy()
	es.Endpoints = es.Endpoints[:1]
	es.ResourceVersion = "2"
	if _, err := h.client.DiscoveryV1().EndpointSlices("ns").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitFor("the scale-down", hasEndpoints(webHTTP, "10.1.0.1:8080", "10.1.0.3:8080"))

	// A port renamed: the old name goes, the new one comes.
	s := svc(func(s *v1.Service) { s.Spec.Ports[0].Name = "web"; s.ResourceVersion = "2" })
	if _, err := h.client.CoreV1().Services("ns").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitFor("the renamed port", func(s *lb.Snapshot) bool {
		return s.Len() == 1 && s.Balancer(lb.ServicePortName{Namespace: "ns", Name: "web", Port: "web"}) != nil
	})

	// Deleted: gone.
	if err := h.client.CoreV1().Services("ns").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitFor("the deletion", func(s *lb.Snapshot) bool { return s.Len() == 0 })

	if q, _ := h.health.get(); q == 0 {
		t.Error("the health tracker was never told of a queued change")
	}
	if got := counter(h.metrics.flushes.WithLabelValues("full")); got != 1 {
		t.Errorf("full flushes = %v, want 1 (the initial sync)", got)
	}
	if got := counter(h.metrics.events.WithLabelValues(kindSlice, "add")); got < 2 {
		t.Errorf("EndpointSlice add events = %v, want at least 2", got)
	}
}

// TestRunCoalesces: changes arriving while a write is under way reach the
// Store together in the next write, not one write per change. (Coalescing
// over time, --min-sync-period, is the sync runner's: runner.TestRunCoalesces.)
func TestRunCoalesces(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	h := startWith(t, func(o *Options) {
		o.OnSync = func(int, error) {
			if calls.Add(1) == 1 { // the initial write: hold it while the burst arrives
				close(entered)
				<-release
			}
		}
	})
	<-entered
	first := h.store.Snapshot().Version
	ctx := context.Background()
	const n = 100
	for i := 0; i < n; i++ {
		s := svc(func(s *v1.Service) {
			s.Name = fmt.Sprintf("svc-%d", i)
			ip := fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)
			s.Spec.ClusterIP, s.Spec.ClusterIPs = ip, []string{ip}
		})
		if _, err := h.client.CoreV1().Services("ns").Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); counter(h.metrics.pending) != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			close(release)
			t.Fatalf("%v Services pending, want %d", counter(h.metrics.pending), n)
		}
	}
	close(release)
	snap := h.waitFor("every Service", func(s *lb.Snapshot) bool { return s.Len() == n })
	if writes := snap.Version - first; writes != 1 {
		t.Errorf("%d Services created during a write took %d more Store writes, want 1", n, writes)
	}
	if got := counter(h.metrics.servicePorts); got != n {
		t.Errorf("service_ports = %v, want %d", got, n)
	}
}

// TestRunInvalidObjects: a bad Service and a bad slice are logged and
// counted; the good parts and every other Service are served.
func TestRunInvalidObjects(t *testing.T) {
	bad := svc(func(s *v1.Service) {
		s.Name = "bad"
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "999.0.0.1", []string{"999.0.0.1"}
	})
	badSlice := slice("web-bad", discovery.AddressTypeIPv4, httpPort, ep("fd00::1", "", ""), ep("10.1.0.9", "", ""))
	huge := slice("web-huge", discovery.AddressTypeIPv4, httpPort)
	for i := 0; i < 10000; i++ {
		huge.Endpoints = append(huge.Endpoints, ep(fmt.Sprintf("10.3.%d.%d", i/250, i%250+1), "", ""))
	}
	h := start(t, svc(), bad, badSlice, huge)
	h.waitFor("the good Service with the good endpoint", hasEndpoints(webHTTP, "10.1.0.9:8080"))
	if h.store.Snapshot().Len() != 1 {
		t.Errorf("store has %d Service ports, want 1", h.store.Snapshot().Len())
	}
	if got := counter(h.metrics.invalid.WithLabelValues(kindService)); got != 1 {
		t.Errorf("invalid Services = %v, want 1", got)
	}
	if got := counter(h.metrics.invalid.WithLabelValues(kindSlice)); got != 2 {
		t.Errorf("invalid EndpointSlices = %v, want 2", got)
	}
}

// TestRunNodeAndHealthChecks: the Node's deletion reaches the health
// tracker; a LoadBalancer Service with externalTrafficPolicy Local gets a
// health check with its local endpoint count.
func TestRunNodeAndHealthChecks(t *testing.T) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: "z1"},
		Annotations: map[string]string{AnnotationProxyMode: "userspace"}}}
	other := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}}
	lbSvc := svc(func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = 32000
		s.Spec.Ports[0].NodePort = 30080
	})
	es := slice("web-1", discovery.AddressTypeIPv4, httpPort, ep("10.1.0.1", "", "node-a"), ep("10.1.0.2", "", "node-b"))
	h := start(t, node, other, lbSvc, es)
	h.waitFor("the Service", hasEndpoints(webHTTP, "10.1.0.1:8080", "10.1.0.2:8080"))

	select {
	case n := <-h.nodes:
		if n.Name != "node-a" || ProxyMode(n) != "userspace" || Zone(n) != "z1" {
			t.Errorf("OnNode got %s (mode %q, zone %q)", n.Name, ProxyMode(n), Zone(n))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnNode was not called")
	}
	// The health check is served from the snapshot once applied: the Store
	// has what it needs.
	want := map[healthcheck.ServiceName]healthcheck.Service{{Namespace: "ns", Name: "web"}: {Port: 32000, LocalEndpoints: 1}}
	if got := healthcheck.FromSnapshot(h.store.Snapshot()); !maps.Equal(got, want) {
		t.Fatalf("health checks %v, want %v", got, want)
	}

	// The Node is being deleted: /healthz must fail.
	node = node.DeepCopy()
	now := metav1.Now()
	node.DeletionTimestamp = &now
	node.ResourceVersion = "2"
	if _, err := h.client.CoreV1().Nodes().Update(context.Background(), node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, deleting := h.health.get(); deleting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the health tracker was not told the Node is being deleted")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// The Service deleted: its health check closes.
	if err := h.client.CoreV1().Services("ns").Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	snap := h.waitFor("the Service deleted", func(s *lb.Snapshot) bool { return s.Len() == 0 })
	if got := healthcheck.FromSnapshot(snap); len(got) != 0 {
		t.Fatalf("health checks after deletion: %v", got)
	}
}

// TestRunOnlyOwnServices: Services labelled for another proxy are not
// served; a Service relabelled away from svcproxy is removed.
func TestRunOnlyOwnServices(t *testing.T) {
	mine := svc()
	theirs := svc(func(s *v1.Service) {
		s.Name = "theirs"
		s.Labels = map[string]string{LabelServiceProxyName: "other"}
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.0.0.11", []string{"10.0.0.11"}
	})
	h := start(t, mine, theirs)
	h.waitFor("my Service", func(s *lb.Snapshot) bool { return s.Len() == 1 && s.Balancer(webHTTP) != nil })

	mine = mine.DeepCopy()
	mine.Labels = map[string]string{LabelServiceProxyName: "other"}
	mine.ResourceVersion = "2"
	if _, err := h.client.CoreV1().Services("ns").Update(context.Background(), mine, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitFor("the relabelled Service to go", func(s *lb.Snapshot) bool { return s.Len() == 0 })
}

func TestRunOptionsErrors(t *testing.T) {
	store := lb.NewStore(lb.StoreOptions{})
	for name, opts := range map[string]Options{
		"no client": {NodeName: "n"},
		"no node":   {Client: fake.NewClientset()},
	} {
		if err := Run(context.Background(), opts, store); err == nil {
			t.Errorf("%s: Run returned nil", name)
		}
	}
	if err := Run(context.Background(), Options{Client: fake.NewClientset(), NodeName: "n"}, nil); err == nil {
		t.Error("nil store: Run returned nil")
	}
}

// TestRunDualStackAddresses: one lb.Service holds both families.
func TestRunDualStackAddresses(t *testing.T) {
	s := svc(func(s *v1.Service) {
		s.Spec.ClusterIPs = []string{"10.0.0.10", "fd00::10"}
		s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
	})
	h := start(t, s,
		slice("web-v4", discovery.AddressTypeIPv4, httpPort, ep("10.1.0.1", "", "")),
		slice("web-v6", discovery.AddressTypeIPv6, httpPort, ep("fd00:1::1", "", "")))
	snap := h.waitFor("both families", hasEndpoints(webHTTP, "10.1.0.1:8080", "[fd00:1::1]:8080"))
	for _, ip := range []string{"10.0.0.10", "fd00::10"} {
		if snap.Route(lb.TCP, netip.AddrPortFrom(netip.MustParseAddr(ip), 80)) == nil {
			t.Errorf("no route for %s:80", ip)
		}
	}
}

// TestRunFollowsChanges: each change reaches the ChangeTracker with its
// trigger time (a slice's annotation, a new Service's creation), is cut
// with the write that carries it and written at that write's Store version.
func TestRunFollowsChanges(t *testing.T) {
	h := start(t, svc(), slice("web-1", discovery.AddressTypeIPv4, httpPort, ep("10.1.0.1", "", "")))
	h.waitFor("the initial sync", hasEndpoints(webHTTP, "10.1.0.1:8080"))
	waitEvents := func(what string, want []string) {
		t.Helper()
		var got []string
		deadline := time.Now().Add(5 * time.Second)
		for len(got) < len(want) && time.Now().Before(deadline) {
			got = append(got, h.changes.take()...)
			time.Sleep(5 * time.Millisecond)
		}
		if len(got) > 1 && strings.HasPrefix(got[1], "received") {
			slices.Sort(got[:2]) // the two informers' first lists arrive in either order
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: events\n%q\nwant\n%q", what, got, want)
		}
	}
	v := h.store.Snapshot().Version
	waitEvents("initial list", []string{"received EndpointSlice ns/web -", "received Service ns/web -", "cut", fmt.Sprint("written ", v)})

	ctx := context.Background()
	trig := time.Now().Add(-1500 * time.Millisecond).UTC().Truncate(time.Microsecond)
	es2 := slice("web-2", discovery.AddressTypeIPv4, httpPort, ep("10.1.0.2", "", ""))
	es2.Annotations = map[string]string{AnnotationLastChangeTriggerTime: trig.Format(time.RFC3339Nano)}
	if _, err := h.client.DiscoveryV1().EndpointSlices("ns").Create(ctx, es2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	snap := h.waitFor("the new slice", hasEndpoints(webHTTP, "10.1.0.1:8080", "10.1.0.2:8080"))
	waitEvents("slice added", []string{"received EndpointSlice ns/web " + trig.Format(time.RFC3339Nano), "cut", fmt.Sprint("written ", snap.Version)})

	// A change that leaves what is served as it was: written at no version.
	es2 = es2.DeepCopy()
	es2.ResourceVersion = "2"
	es2.Labels["unrelated"] = "x"
	if _, err := h.client.DiscoveryV1().EndpointSlices("ns").Update(ctx, es2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEvents("no-op update", []string{"received EndpointSlice ns/web " + trig.Format(time.RFC3339Nano), "cut", "written 0"})

	// A deleted slice's trigger time is not the deletion's: none is passed.
	if err := h.client.DiscoveryV1().EndpointSlices("ns").Delete(ctx, "web-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	snap = h.waitFor("the slice deleted", hasEndpoints(webHTTP, "10.1.0.1:8080"))
	waitEvents("slice deleted", []string{"received EndpointSlice ns/web -", "cut", fmt.Sprint("written ", snap.Version)})

	// A new Service: its creation time.
	created := metav1.NewTime(time.Now().Add(-time.Second).Truncate(time.Second))
	other := svc(func(s *v1.Service) {
		s.Name, s.CreationTimestamp = "other", created
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.0.0.99", []string{"10.0.0.99"}
	})
	if _, err := h.client.CoreV1().Services("ns").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	snap = h.waitFor("the new Service", func(s *lb.Snapshot) bool { return s.Len() == 2 })
	waitEvents("Service added", []string{"received Service ns/other " + created.UTC().Format(time.RFC3339Nano), "cut", fmt.Sprint("written ", snap.Version)})
}

func TestNodeEligible(t *testing.T) {
	now := metav1.Now()
	tests := []struct {
		name string
		node v1.Node
		want bool
	}{
		{"plain", v1.Node{}, true},
		{"being deleted", v1.Node{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}}, false},
		{"autoscaler's taint", v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: TaintToBeDeleted, Effect: v1.TaintEffectNoSchedule}}}}, false},
		{"another taint", v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: "dedicated", Effect: v1.TaintEffectNoSchedule}}}}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := NodeEligible(&tc.node); got != tc.want {
				t.Errorf("NodeEligible = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestTriggerTime(t *testing.T) {
	at := time.Date(2026, 11, 25, 6, 0, 0, 123456789, time.UTC)
	withAnn := func(v string) *discovery.EndpointSlice {
		es := slice("web-1", discovery.AddressTypeIPv4, httpPort)
		es.Annotations = map[string]string{AnnotationLastChangeTriggerTime: v}
		return es
	}
	created := svc(func(s *v1.Service) { s.CreationTimestamp = metav1.NewTime(at) })
	tests := []struct {
		name  string
		obj   any
		added bool
		want  time.Time
	}{
		{"slice annotation", withAnn(at.Format(time.RFC3339Nano)), false, at},
		{"slice annotation, added", withAnn(at.Format(time.RFC3339Nano)), true, at},
		{"unparsable annotation", withAnn("yesterday"), false, time.Time{}},
		{"no annotation", slice("web-1", discovery.AddressTypeIPv4, httpPort), false, time.Time{}},
		{"Service added: its creation", created, true, at},
		{"Service updated: no time of its own", created, false, time.Time{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := triggerTime(tc.obj, tc.added); !got.Equal(tc.want) {
				t.Errorf("triggerTime = %v, want %v", got, tc.want)
			}
		})
	}
}

// poolOf names the endpoints of name's internal pool: what is applied.
func poolOf(name lb.ServicePortName, want ...string) func(*lb.Snapshot) bool {
	return func(s *lb.Snapshot) bool {
		b := s.Balancer(name)
		if b == nil {
			return false
		}
		var got []string
		for _, be := range b.Internal.Backends() {
			got = append(got, be.Addr.String())
		}
		return slices.Equal(got, want)
	}
}

// TestRunFollowsZone: with no fixed zone, the Node's
// topology.kubernetes.io/zone label decides which hinted endpoints are
// applied, and a change of the label (or its removal) applies others
// without a restart; with a fixed zone (--zone) the label is ignored.
func TestRunFollowsZone(t *testing.T) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: "z1"}, ResourceVersion: "1"}}
	web := svc(func(s *v1.Service) { s.Spec.TrafficDistribution = ptr(v1.ServiceTrafficDistributionPreferSameZone) })
	es := slice("web-1", discovery.AddressTypeIPv4, httpPort, ep("10.1.0.1", "", "node-a", "z1"), ep("10.1.0.2", "", "node-b", "z2"))
	relabel := func(h *harness, zone string) {
		t.Helper()
		n, err := h.client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n = n.DeepCopy()
		if zone == "" {
			delete(n.Labels, v1.LabelTopologyZone)
		} else {
			n.Labels[v1.LabelTopologyZone] = zone
		}
		rv, _ := strconv.Atoi(n.ResourceVersion)
		n.ResourceVersion = strconv.Itoa(rv + 1)
		if _, err := h.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("followed", func(t *testing.T) {
		h := start(t, node, web, es)
		h.waitFor("zone z1's endpoint", poolOf(webHTTP, "10.1.0.1:8080"))
		relabel(h, "z2")
		h.waitFor("zone z2's endpoint after the label changed", poolOf(webHTTP, "10.1.0.2:8080"))
		if z := h.store.Node().Zone; z != "z2" {
			t.Errorf("the Store's zone is %q, want z2", z)
		}
		relabel(h, "")
		h.waitFor("every endpoint once the node has no zone", poolOf(webHTTP, "10.1.0.1:8080", "10.1.0.2:8080"))
	})

	t.Run("fixed by --zone", func(t *testing.T) {
		h := startWith(t, func(o *Options) { o.Zone = "z1" }, node, web, es)
		if _, err := h.store.SetNode(lb.Node{Name: "node-a", Zone: "z1"}); err != nil { // as main does with --zone
			t.Fatal(err)
		}
		h.waitFor("zone z1's endpoint", poolOf(webHTTP, "10.1.0.1:8080"))
		relabel(h, "z2")
		// OnNode runs after the zone was (not) followed for this event.
		deadline := time.After(5 * time.Second)
		for seen := false; !seen; {
			select {
			case n := <-h.nodes:
				seen = Zone(n) == "z2"
			case <-deadline:
				t.Fatal("the relabelled Node never arrived")
			}
		}
		if !poolOf(webHTTP, "10.1.0.1:8080")(h.store.Snapshot()) || h.store.Node().Zone != "z1" {
			t.Errorf("with --zone z1, a z2 label changed the zone to %q", h.store.Node().Zone)
		}
	})
}
