package userspace

import (
	"context"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/forwarder"
	"github.com/svcproxy/svcproxy/lb"
)

// TestMode serves a loopback Service without steering (the forwarder binds
// the frontend itself) through Apply, then Close drains the forwarder and
// the frontend refuses connections.
func TestMode(t *testing.T) {
	backend, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	go func() {
		for {
			c, err := backend.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	front := probe.Addr().(*net.TCPAddr).AddrPort()
	probe.Close()

	m, err := New(Config{Forwarder: forwarder.Config{Workers: 1, Mark: -1, DrainTimeout: time.Second, Logger: zaptest.NewLogger(t)}, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Available(context.Background()); err != nil {
		t.Errorf("Available without steering: %v, want nil", err)
	}
	if m.Steering() != nil {
		t.Error("Steering() without steering is not nil")
	}
	store := lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: "node-a"}})
	snap, err := store.Replace([]lb.Service{{Name: lb.ServicePortName{Namespace: "ns", Name: "echo"}, Protocol: lb.TCP, Port: front.Port(),
		ClusterIPs: []netip.Addr{front.Addr()},
		Endpoints:  []lb.Endpoint{{Addr: backend.Addr().(*net.TCPAddr).AddrPort(), Ready: true, Serving: true}}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := m.Apply(ctx, snap, true); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	c, err := net.DialTimeout("tcp", front.String(), 2*time.Second)
	if err != nil {
		t.Fatalf("dialing the Service at %v: %v", front, err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "ping"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through the Service: %q, %v", buf, err)
	}
	c.Close()

	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := m.Close(sctx, false); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if c, err := net.DialTimeout("tcp", front.String(), time.Second); err == nil {
		c.Close()
		t.Fatalf("the frontend %v still accepts after Close", front)
	} else if !strings.Contains(err.Error(), "refused") {
		t.Logf("dial after Close: %v", err)
	}
}
