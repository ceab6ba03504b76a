package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/svcproxy/svcproxy/config"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/source/kube"
	"github.com/svcproxy/svcproxy/test/apiserver"
)

const deployDir = "../../deploy"

// manifests decodes every object of every YAML file in deploy/ (the
// kustomization excepted: it is kubectl's, not the API's).
func manifests(t testing.TB) []*unstructured.Unstructured {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(deployDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", deployDir, err)
	}
	var objs []*unstructured.Unstructured
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var u unstructured.Unstructured
			if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if len(u.Object) > 0 {
				objs = append(objs, &u)
			}
		}
	}
	return objs
}

// applier creates unstructured objects through the dynamic client.
type applier struct {
	mapper meta.RESTMapper
	dyn    dynamic.Interface
}

func newApplier(t testing.TB, srv *apiserver.Server) *applier {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	return &applier{mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)), dyn: dyn}
}

func (a *applier) create(ctx context.Context, u *unstructured.Unstructured, dryRun bool) error {
	gvk := u.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = a.dyn.Resource(m.Resource).Namespace(u.GetNamespace())
	}
	opts := metav1.CreateOptions{FieldValidation: "Strict"}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = ri.Create(ctx, u, opts)
	return err
}

// TestKubeDeployDryRun: every object in deploy/ passes the real API
// server's validation and admission (server-side dry run, strict field
// validation), and the ConfigMap holds a valid svcproxy configuration.
func TestKubeDeployDryRun(t *testing.T) {
	srv := server(t)
	a := newApplier(t, srv)
	var kinds []string
	for _, u := range manifests(t) {
		kinds = append(kinds, u.GetKind())
		if err := a.create(context.Background(), u, true); err != nil {
			t.Errorf("%s %s/%s: server-side dry run: %v", u.GetKind(), u.GetNamespace(), u.GetName(), err)
		}
		if u.GetKind() == "ConfigMap" {
			data, _, _ := unstructured.NestedString(u.Object, "data", "config.yaml")
			c, err := config.Parse([]byte(data))
			if err != nil {
				t.Errorf("ConfigMap %s: config.yaml: %v", u.GetName(), err)
			} else if len(c.Warnings) > 0 {
				t.Errorf("ConfigMap %s: config.yaml has ignored fields: %v", u.GetName(), c.Warnings)
			}
		}
	}
	for _, want := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet"} {
		if !slices.Contains(kinds, want) {
			t.Errorf("deploy/ has no %s (has %v)", want, kinds)
		}
	}
}

// TestKubeDeployRBAC: with the ServiceAccount, ClusterRole and binding from
// deploy/ created for real and a token minted for that ServiceAccount
// (TokenRequest), the source lists and watches what it needs and reads its
// Node; the same token cannot write, and a ServiceAccount without the
// binding cannot feed the store at all.
func TestKubeDeployRBAC(t *testing.T) {
	srv := server(t)
	ctx := context.Background()
	a := newApplier(t, srv)
	var sa *unstructured.Unstructured
	for _, u := range manifests(t) {
		switch u.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding":
			if err := a.create(ctx, u, false); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("creating %s %s: %v", u.GetKind(), u.GetName(), err)
			}
			if u.GetKind() == "ServiceAccount" {
				sa = u
			}
		}
	}
	if sa == nil {
		t.Fatal("deploy/ has no ServiceAccount")
	}
	token := func(ns, name string) string {
		tr, err := srv.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name,
			&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: ptr[int64](3600)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("TokenRequest for %s/%s: %v", ns, name, err)
		}
		return tr.Status.Token
	}
	clientFor := func(tok string) kubernetes.Interface {
		c, err := kubernetes.NewForConfig(srv.ConfigFor(tok))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	saClient := clientFor(token(sa.GetNamespace(), sa.GetName()))

	ns := namespace(t, srv.Client)
	if _, err := srv.Client.CoreV1().Services(ns).Create(ctx, service(ns, "web", "10.96.2.1", 80), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, endpointSlice(ns, "web", "web-1", 8080, ready("10.244.2.1")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"},
		Annotations: map[string]string{kube.AnnotationProxyMode: "userspace"}}}
	if _, err := srv.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}

	// What the daemon does at start, then the source.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := kube.WaitForNode(wctx, saClient, "node-a", nil)
	if err != nil {
		t.Fatalf("the ServiceAccount cannot get its Node: %v", err)
	}
	if kube.ProxyMode(n) != "userspace" || kube.Zone(n) != "zone-a" {
		t.Errorf("Node: mode %q zone %q", kube.ProxyMode(n), kube.Zone(n))
	}
	p := startPipeline(t, pipelineOptions{client: saClient, minSyncPeriod: syncInterval})
	name := lb.ServicePortName{Namespace: ns, Name: "web", Port: "http"}
	p.waitStore(t, "the Service, read with the ServiceAccount's token", 30*time.Second, func(s *lb.Snapshot) bool {
		b := s.Balancer(name)
		return b != nil && len(b.Service.Endpoints) == 1
	})
	if got := counterValue(t, p.reg, "svcproxy_kube_watch_errors_total", ""); got != 0 {
		t.Errorf("%v watch errors with the deploy/ RBAC (forbidden?)", got)
	}

	// Minimal: it reads, it does not write.
	if _, err := saClient.CoreV1().Services(ns).Create(ctx, service(ns, "nope", "", 80), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the ServiceAccount could create a Service (err %v): the ClusterRole is broader than needed", err)
	}
	if _, err := saClient.CoreV1().Endpoints(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the ServiceAccount could list v1 Endpoints (err %v): not needed", err)
	}

	// The control: without the binding, nothing reaches the store.
	other := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unbound"}}
	if _, err := srv.Client.CoreV1().ServiceAccounts(ns).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	q := startPipeline(t, pipelineOptions{client: clientFor(token(ns, "unbound")), minSyncPeriod: syncInterval})
	eventually(t, "forbidden watch errors for the unbound ServiceAccount", 20*time.Second, func() error {
		if counterValue(t, q.reg, "svcproxy_kube_watch_errors_total", "") == 0 {
			return notYet("no watch error yet")
		}
		return nil
	})
	if v := q.store.Snapshot().Version; v != 0 {
		t.Errorf("an unbound ServiceAccount fed the store (version %d)", v)
	}
}
