package kube

import (
	"context"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/svcproxy/svcproxy/lb"
)

// TestProxyNameSplitsServices: two proxies on one cluster, one unnamed (as
// kube-proxy) and one named, each serve only their own Services, and each
// asks the API server for only those (the label selector of the Service
// informer's list and watch).
func TestProxyNameSplitsServices(t *testing.T) {
	named := func(name, ip, proxy string) *v1.Service {
		return svc(func(s *v1.Service) {
			s.Name = name
			s.Spec.ClusterIP, s.Spec.ClusterIPs = ip, []string{ip}
			if proxy != "" {
				s.Labels = map[string]string{LabelServiceProxyName: proxy}
			}
		})
	}
	objs := []runtime.Object{
		named("plain", "10.0.0.10", ""),
		named("for-b", "10.0.0.11", "svcproxy-b"),
		named("for-c", "10.0.0.12", "svcproxy-c"),
	}
	for _, tc := range []struct {
		proxyName    string
		wantSelector string
		want         []string // Service names served
	}{
		{"", "!" + LabelServiceProxyName, []string{"plain"}},
		{"svcproxy-b", LabelServiceProxyName + "=svcproxy-b", []string{"for-b"}},
		{"svcproxy-c", LabelServiceProxyName + "=svcproxy-c", []string{"for-c"}},
	} {
		t.Run("proxyName="+tc.proxyName, func(t *testing.T) {
			client := fake.NewClientset(objs...)
			store := lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: "node-a"}})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				done <- Run(ctx, Options{Client: client, NodeName: "node-a", ProxyName: tc.proxyName, Logger: zaptest.NewLogger(t)}, store)
			}()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			}()

			deadline := time.Now().Add(5 * time.Second)
			var got []string
			for {
				got = got[:0]
				for _, b := range store.Snapshot().Balancers() {
					if !slices.Contains(got, b.Service.Name.Name) {
						got = append(got, b.Service.Name.Name)
					}
				}
				slices.Sort(got)
				if slices.Equal(got, tc.want) || time.Now().After(deadline) {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("served %v, want %v", got, tc.want)
			}
			var selectors []string
			for _, a := range client.Actions() {
				if a.GetResource().Resource != "services" {
					continue
				}
				switch a := a.(type) {
				case k8stesting.ListAction:
					selectors = append(selectors, "list "+a.GetListRestrictions().Labels.String())
				case k8stesting.WatchAction:
					selectors = append(selectors, "watch "+a.GetWatchRestrictions().Labels.String())
				}
			}
			want := []string{"list " + tc.wantSelector, "watch " + tc.wantSelector}
			if !slices.Equal(selectors, want) {
				t.Errorf("Service requests %q, want %q", selectors, want)
			}
		})
	}
}
