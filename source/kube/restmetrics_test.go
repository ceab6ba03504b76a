package kube

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestRESTClientMetrics: a request the server answers counts under its
// status code, one that finds no server under "<error>". client-go's
// registration is process-wide and once only, so this is the only test of
// the package that makes it.
func TestRESTClientMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	RegisterRESTClientMetrics(reg)
	RegisterRESTClientMetrics(prometheus.NewRegistry()) // a second call does nothing, and does not panic

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "down for maintenance", http.StatusInternalServerError)
	}))
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close() // nothing listens there any more: connection refused

	for _, tc := range []struct {
		host string
		code string
	}{
		{srv.URL, "500"},
		{"http://" + closed, "<error>"},
	} {
		cs, err := kubernetes.NewForConfig(&rest.Config{Host: tc.host})
		if err != nil {
			t.Fatal(err)
		}
		// One GET, no retries: client-go retries 5xx only with Retry-After.
		if _, err := cs.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{}); err == nil {
			t.Fatalf("%s: GET succeeded, want an error", tc.host)
		}
		host := strings.TrimPrefix(tc.host, "http://")
		if got := requests(t, reg, tc.code, "GET", host); got != 1 {
			t.Errorf("%s: rest_client_requests_total{code=%q,method=GET,host=%q} = %v, want 1", tc.host, tc.code, host, got)
		}
	}
}

// requests reads svcproxy_kube_rest_client_requests_total{code,method,host}
// from what reg exposes.
func requests(t *testing.T, reg *prometheus.Registry, code, method, host string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"code": code, "method": method, "host": host}
	for _, f := range families {
		if f.GetName() != "svcproxy_kube_rest_client_requests_total" {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if want[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}
