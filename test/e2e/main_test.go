package e2e

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/svcproxy/svcproxy/internal/proctest"
	"github.com/svcproxy/svcproxy/test/apiserver"
)

// privateEnv marks the copy of the test binary re-run in its own network
// namespace.
const privateEnv = "SVCPROXY_E2E_PRIVATE_NETNS"

// buildErrorEnv carries why the binaries could not be built into the re-run
// copy, which skips with it.
const buildErrorEnv = "SVCPROXY_E2E_BUILD_ERROR"

// Address plan inside the private network namespace: both ranges are
// local on lo, so ClusterIPs can be bound and backends listen without
// touching any real interface.
var (
	serviceCIDR = netip.MustParsePrefix("10.96.0.0/16")
	backendCIDR = netip.MustParsePrefix("10.244.0.0/16")
)

// private reports whether this process runs in its own network namespace
// with the address plan on lo (root only).
var private bool

func TestMain(m *testing.M) {
	if os.Getenv(privateEnv) == "" && os.Geteuid() == 0 {
		if unshare, err := exec.LookPath("unshare"); err == nil {
			if _, err := exec.LookPath("ip"); err == nil {
				// Build (or find cached) kube-apiserver and etcd here, where
				// the Go module proxy is reachable: the copy re-run below
				// has no network at all.
				env := []string{privateEnv + "=1"}
				logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "e2e: "+format+"\n", args...) }
				if _, err := apiserver.Build(context.Background(), logf); err != nil {
					env = append(env, buildErrorEnv+"="+err.Error())
				}
				// Run the whole package in a fresh network namespace: the
				// API server, the backends, the ClusterIPs and svcproxy's
				// rules all live there and vanish with it.
				cmd := exec.Command(unshare, append([]string{"--net", "--", os.Args[0]}, os.Args[1:]...)...)
				cmd.Env = append(os.Environ(), env...)
				cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
				if err := cmd.Run(); err != nil {
					if ee, ok := err.(*exec.ExitError); ok {
						os.Exit(ee.ExitCode())
					}
					fmt.Fprintln(os.Stderr, "e2e: re-running in a private network namespace:", err)
					os.Exit(1)
				}
				os.Exit(0)
			}
		}
	}
	if os.Getenv(privateEnv) == "1" {
		for _, args := range [][]string{
			{"link", "set", "lo", "up"},
			{"addr", "add", serviceCIDR.String(), "dev", "lo"},
			{"addr", "add", backendCIDR.String(), "dev", "lo"},
		} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "e2e: ip %s: %v: %s\n", strings.Join(args, " "), err, out)
				os.Exit(1)
			}
		}
		private = true
	}
	code := m.Run()
	shared.mu.Lock()
	if shared.srv != nil {
		_ = shared.srv.Stop()
	}
	shared.mu.Unlock()
	os.Exit(code)
}

// needPrivate skips tests that bind ClusterIPs and backend addresses.
func needPrivate(t testing.TB) {
	t.Helper()
	if !private {
		t.Skip("skipping: needs root, unshare and ip (iproute2) to run in a private network namespace with Service and backend addresses on lo")
	}
}

var shared struct {
	mu  sync.Mutex
	srv *apiserver.Server
	err error
}

// server returns the package's API server, started on first use. Tests
// share it (each in its own namespace); it is stopped after every test.
func server(t testing.TB) *apiserver.Server {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv == nil && shared.err == nil {
		bins, err := buildBinaries(t)
		if err != nil {
			shared.err = fmt.Errorf("skipping: kube-apiserver and etcd cannot be built here: %w", err)
		} else {
			srv, err := apiserver.Start(context.Background(), bins, apiserver.Options{ServiceCIDR: serviceCIDR.String(), Logf: t.Logf})
			if err != nil {
				t.Fatalf("starting the API server: %v", err)
			}
			shared.srv = srv
		}
	}
	if shared.err != nil {
		t.Skip(shared.err)
	}
	return shared.srv
}

// buildBinaries builds or finds the cached binaries; in the re-run copy, a
// build that failed in the parent is not retried (there is no network).
func buildBinaries(t testing.TB) (apiserver.Binaries, error) {
	if msg := os.Getenv(buildErrorEnv); msg != "" {
		return apiserver.Binaries{}, errors.New(msg)
	}
	return apiserver.Build(context.Background(), t.Logf)
}

// namespace creates a namespace for t and, at cleanup, deletes the
// Services and EndpointSlices in it (no namespace controller runs, so
// deleting the namespace alone would leave them for the next test's
// source to see).
func namespace(t testing.TB, c kubernetes.Interface) string {
	t.Helper()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := fmt.Sprintf("e2e-%x", b)
	ctx := context.Background()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteAll(t, c, name) })
	return name
}

func deleteAll(t testing.TB, c kubernetes.Interface, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.DiscoveryV1().EndpointSlices(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Errorf("deleting EndpointSlices in %s: %v", ns, err)
	}
	// Services have no DeleteCollection: one by one.
	list, err := c.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Errorf("listing Services in %s: %v", ns, err)
		return
	}
	proctest.Parallel(len(list.Items), 16, func(i int) error {
		return c.CoreV1().Services(ns).Delete(ctx, list.Items[i].Name, metav1.DeleteOptions{})
	})
	_ = c.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
}

// service is a ClusterIP Service with one TCP port "http" on port.
func service(ns, name, clusterIP string, port int32) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			ClusterIP: clusterIP,
			Ports:     []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: port}},
		},
	}
}

// endpoint is a slice entry with its ready/serving/terminating conditions.
type endpoint struct {
	addr                        string
	ready, serving, terminating bool
}

func ready(addr string) endpoint { return endpoint{addr, true, true, false} }

// endpointSlice is svc's slice named name with targetPort and eps.
func endpointSlice(ns, svc, name string, targetPort int32, eps ...endpoint) *discovery.EndpointSlice {
	es := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			discovery.LabelServiceName: svc,
			discovery.LabelManagedBy:   "svcproxy-e2e",
		}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(targetPort)}},
	}
	for _, e := range eps {
		es.Endpoints = append(es.Endpoints, discovery.Endpoint{
			Addresses:  []string{e.addr},
			Conditions: discovery.EndpointConditions{Ready: ptr(e.ready), Serving: ptr(e.serving), Terminating: ptr(e.terminating)},
		})
	}
	return es
}

func ptr[T any](v T) *T { return &v }

// dialable reports whether host:port accepts TCP connections (the
// Service's frontend) within a second.
func dialable(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		conn.Close()
	}
	return err
}
