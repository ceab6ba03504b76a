package apiserver

import (
	"context"
	"testing"

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
