package kube

import (
	"os"
	"path/filepath"
	"testing"
)

const testKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://10.0.0.1:6443"}
users:
- name: u
  user: {token: t}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`

// TestRESTConfig: clientConnection (qps, burst, contentType) and --master
// reach the client's configuration.
func TestRESTConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(testKubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		cfg        ClientConfig
		host       string
		qps        float32
		burst      int
		ct, accept string
	}{
		{"defaults", ClientConfig{Kubeconfig: path}, "https://10.0.0.1:6443", 5, 10,
			"application/vnd.kubernetes.protobuf", "application/vnd.kubernetes.protobuf,application/json"},
		{"clientConnection", ClientConfig{Kubeconfig: path, QPS: 50, Burst: 100, ContentType: "application/json"}, "https://10.0.0.1:6443", 50, 100,
			"application/json", ""},
		{"protobuf named", ClientConfig{Kubeconfig: path, ContentType: "application/vnd.kubernetes.protobuf"}, "https://10.0.0.1:6443", 5, 10,
			"application/vnd.kubernetes.protobuf", "application/vnd.kubernetes.protobuf,application/json"},
		{"master overrides the kubeconfig", ClientConfig{Kubeconfig: path, Master: "https://192.0.2.1:6443"}, "https://192.0.2.1:6443", 5, 10,
			"application/vnd.kubernetes.protobuf", "application/vnd.kubernetes.protobuf,application/json"},
		{"master alone", ClientConfig{Master: "http://192.0.2.1:8080"}, "http://192.0.2.1:8080", 5, 10,
			"application/vnd.kubernetes.protobuf", "application/vnd.kubernetes.protobuf,application/json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc, err := RESTConfig(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if rc.Host != tc.host || rc.QPS != tc.qps || rc.Burst != tc.burst || rc.ContentType != tc.ct || rc.AcceptContentTypes != tc.accept {
				t.Errorf("got host %s qps %v burst %d content type %q accept %q, want %s %v %d %q %q",
					rc.Host, rc.QPS, rc.Burst, rc.ContentType, rc.AcceptContentTypes, tc.host, tc.qps, tc.burst, tc.ct, tc.accept)
			}
		})
	}
}
