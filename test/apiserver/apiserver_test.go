package apiserver

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// TestStart: the harness brings up a real API server whose admin
// kubeconfig works and whose RBAC is on (an unknown token is refused).
func TestStart(t *testing.T) {
	s := StartT(t, Options{})
	ctx := context.Background()
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{}); err != nil {
		t.Errorf("the admin cannot read default/kubernetes: %v", err)
	}
	stranger, err := kubernetes.NewForConfig(s.ConfigFor("not-a-token"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stranger.CoreV1().Services("default").List(ctx, metav1.ListOptions{}); err == nil {
		t.Error("an unknown token listed Services")
	}
}

// TestKillRestartPeer: Kill takes the API server down with etcd left up;
// a peer on the same etcd serves meanwhile, and what it writes is there
// when Restart brings the first one back at the same address, where the
// clients made before work again.
func TestKillRestartPeer(t *testing.T) {
	s := StartT(t, Options{})
	ctx := context.Background()
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err == nil {
		t.Fatal("the API server answered after Kill")
	}
	peer, err := s.StartPeer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if peer.URL == s.URL {
		t.Fatalf("the peer listens at %s too", s.URL)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "written-through-the-peer"}}
	if _, err := peer.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("writing through the peer: %v", err)
	}
	if err := peer.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(ctx); err == nil {
		t.Error("Restart of a running API server did not fail")
	}
	if _, err := s.Client.CoreV1().Namespaces().Get(ctx, ns.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("after Restart, what the peer wrote: %v", err)
	}
	if log := s.Log("kube-apiserver"); !strings.Contains(log, "started again") {
		t.Error("the restarted API server's log does not go on in the same file")
	}
}
