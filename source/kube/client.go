package kube

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// ClientConfig is kube-proxy's clientConnection.
type ClientConfig struct {
	Kubeconfig string  // path; empty, and no Master: the in-cluster ServiceAccount (KUBERNETES_SERVICE_HOST and the mounted token)
	Master     string  // API server address, overriding the kubeconfig's (kube-proxy's --master)
	QPS        float32 // requests per second to the API server; zero: 5
	Burst      int     // burst above QPS; zero: 10
	// ContentType of requests; empty: protobuf, as kube-proxy.
	ContentType string
	UserAgent   string // empty: "svcproxy"
}

// NewClient returns a clientset for cfg.
func NewClient(cfg ClientConfig) (kubernetes.Interface, error) {
	rc, err := RESTConfig(cfg)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("creating the API client: %w", err)
	}
	return cs, nil
}

// RESTConfig returns the client configuration for cfg.
func RESTConfig(cfg ClientConfig) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if cfg.Kubeconfig == "" && cfg.Master == "" {
		rc, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no kubeconfig given and not in a cluster: %w", err)
		}
	} else {
		rc, err = clientcmd.BuildConfigFromFlags(cfg.Master, cfg.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("loading kubeconfig %q (master %q): %w", cfg.Kubeconfig, cfg.Master, err)
		}
	}
	rc.QPS, rc.Burst = cfg.QPS, cfg.Burst
	if rc.QPS == 0 {
		rc.QPS = 5
	}
	if rc.Burst == 0 {
		rc.Burst = 10
	}
	rc.ContentType = cfg.ContentType
	if rc.ContentType == "" {
		rc.ContentType = "application/vnd.kubernetes.protobuf"
	}
	if rc.ContentType == "application/vnd.kubernetes.protobuf" {
		rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	}
	rc.UserAgent = cfg.UserAgent
	if rc.UserAgent == "" {
		rc.UserAgent = "svcproxy"
	}
	return rc, nil
}

// WaitForNode gets the Node named name, retrying every second while it is
// missing or the API server cannot be reached, until ctx ends (give it a
// deadline: kube-proxy waits up to 30s, then carries on without zone or
// proxy-mode annotation).
func WaitForNode(ctx context.Context, client kubernetes.Interface, name string, log *zap.Logger) (*v1.Node, error) {
	if log == nil {
		log = zap.NewNop()
	}
	var last error
	for attempt := 0; ; attempt++ {
		node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			return node, nil
		}
		last = err
		if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
			return nil, fmt.Errorf("getting Node %s: %w", name, err)
		}
		if attempt == 0 {
			log.Info("waiting for this node's Node object", zap.String("node", name), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("getting Node %s: %w", name, errors.Join(ctx.Err(), last))
		case <-time.After(time.Second):
		}
	}
}
