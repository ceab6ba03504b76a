package e2e

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/svcproxy/svcproxy/lb"
)

// TestKubeLoadBalancerSourceRanges: a LoadBalancer Service's
// spec.loadBalancerSourceRanges, as a real API server stores them (padding
// included, which its validation lets through), reach the store with its
// ingress IP, and then follow an edit; the firewall (package firewall, run
// by the daemon) enforces what the store holds.
func TestKubeLoadBalancerSourceRanges(t *testing.T) {
	srv := server(t)
	ctx := context.Background()
	ns := namespace(t, srv.Client)
	svc := service(ns, "fenced", "10.96.2.1", 80)
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Spec.LoadBalancerSourceRanges = []string{" 10.0.0.0/8", "192.168.1.0/24 "}
	created, err := srv.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.10"}}
	if _, err := srv.Client.CoreV1().Services(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, endpointSlice(ns, "fenced", "fenced-1", 8080, ready("10.244.2.1")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := startPipeline(t, pipelineOptions{client: srv.Client})
	name := lb.ServicePortName{Namespace: ns, Name: "fenced", Port: "http"}
	ranges := func(want ...string) func(*lb.Snapshot) bool {
		var w []netip.Prefix
		for _, r := range want {
			w = append(w, netip.MustParsePrefix(r))
		}
		return func(s *lb.Snapshot) bool {
			b := s.Balancer(name)
			return b != nil && slices.Equal(b.Service.LoadBalancerIPs, []netip.Addr{netip.MustParseAddr("192.0.2.10")}) &&
				slices.Equal(b.Service.LoadBalancerSourceRanges, w)
		}
	}
	p.waitStore(t, "the ranges and the ingress IP", 30*time.Second, ranges("10.0.0.0/8", "192.168.1.0/24"))

	cur, err := srv.Client.CoreV1().Services(ns).Get(ctx, "fenced", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.LoadBalancerSourceRanges = []string{"172.16.0.0/12"}
	if _, err := srv.Client.CoreV1().Services(ns).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	p.waitStore(t, "the edited ranges", 30*time.Second, ranges("172.16.0.0/12"))
	got := p.store.Snapshot().Balancer(name).Service.AllowedSources(netip.MustParseAddr("192.0.2.10"), nil)
	if want := []netip.Prefix{netip.MustParsePrefix("172.16.0.0/12")}; !slices.Equal(got, want) {
		t.Errorf("AllowedSources = %v, want %v", got, want)
	}
}
