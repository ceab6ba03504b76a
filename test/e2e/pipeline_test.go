package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"k8s.io/client-go/kubernetes"

	"github.com/svcproxy/svcproxy/forwarder"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/source/kube"
)

// pipeline is svcproxy's userspace mode wired as cmd/svcproxy wires it,
// in process: source/kube → lb.Store → forwarder.Apply on every snapshot
// (frontends bound directly: ClusterIPs are local in the private network
// namespace).
type pipeline struct {
	store   *lb.Store
	reg     *prometheus.Registry // the source's metrics
	fwd     *forwarder.Forwarder
	applied atomic.Uint64 // the last snapshot version the forwarder applied
	cancel  context.CancelFunc
	done    sync.WaitGroup
}

type pipelineOptions struct {
	client        kubernetes.Interface
	minSyncPeriod time.Duration // unused: the source no longer coalesces (the runner does); remove with its callers
	forward       bool          // run the forwarder (binds frontends)
	logger        *zap.Logger
}

func startPipeline(t testing.TB, o pipelineOptions) *pipeline {
	t.Helper()
	if o.logger == nil {
		o.logger = zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	}
	p := &pipeline{
		store: lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: "node-a"}}),
		reg:   prometheus.NewRegistry(),
	}
	metrics := kube.NewMetrics(p.reg)
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	if o.forward {
		fwd, err := forwarder.New(forwarder.Config{BindFrontends: true, Mark: -1, DrainTimeout: time.Second,
			Logger: o.logger, Metrics: forwarder.NewMetrics(prometheus.NewRegistry())})
		if err != nil {
			t.Fatal(err)
		}
		p.fwd = fwd
		updates := p.store.Subscribe()
		p.done.Add(1)
		go func() {
			defer p.done.Done()
			for {
				snap := p.store.Snapshot()
				if err := fwd.Apply(ctx, snap); err != nil {
					o.logger.Debug("applied with errors", zap.Error(err))
				}
				p.applied.Store(snap.Version)
				select {
				case <-ctx.Done():
					return
				case <-updates:
				}
			}
		}()
	}
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		err := kube.Run(ctx, kube.Options{Client: o.client, NodeName: "node-a",
			Logger: o.logger, Metrics: metrics}, p.store)
		if err != nil {
			t.Errorf("kube.Run: %v", err)
		}
	}()
	t.Cleanup(p.stop)
	return p
}

func (p *pipeline) stop() {
	p.cancel()
	p.done.Wait()
	if p.fwd != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.fwd.Shutdown(ctx)
	}
}

// waitStore polls the Store until cond holds or timeout passes.
func (p *pipeline) waitStore(t testing.TB, what string, timeout time.Duration, cond func(*lb.Snapshot) bool) *lb.Snapshot {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		snap := p.store.Snapshot()
		if cond(snap) {
			return snap
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s (store version %d, %d Service ports)", timeout, what, snap.Version, snap.Len())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// backend is an HTTP server answering its name, on a backend address.
type backend struct {
	name string
	addr string // ip:port
	srv  *http.Server
}

func startBackend(t testing.TB, name, addr string) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("backend %s on %s: %v", name, addr, err)
	}
	b := &backend{name: name, addr: addr}
	b.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, name)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = b.srv.Serve(ln) }()
	t.Cleanup(func() { _ = b.srv.Close() })
	return b
}

// hits sends n requests to addr (a new connection each) and counts the
// backends that answered.
func hits(addr string, n int) (map[string]int, error) {
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	seen := map[string]int{}
	for i := 0; i < n; i++ {
		resp, err := c.Get("http://" + addr + "/")
		if err != nil {
			return seen, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return seen, err
		}
		seen[string(body)]++
	}
	return seen, nil
}

// sameSet reports whether seen's keys are exactly want.
func sameSet(seen map[string]int, want ...string) bool {
	if len(seen) != len(want) {
		return false
	}
	for _, w := range want {
		if seen[w] == 0 {
			return false
		}
	}
	return true
}

// eventually retries check until it returns nil or timeout passes, and
// returns how long it took.
func eventually(t testing.TB, what string, timeout time.Duration, check func() error) time.Duration {
	t.Helper()
	start := time.Now()
	var err error
	for time.Since(start) < timeout {
		if err = check(); err == nil {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v: %v", what, timeout, err)
	return 0
}

var errNotYet = errors.New("not yet")

func notYet(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errNotYet, fmt.Sprintf(format, args...))
}
