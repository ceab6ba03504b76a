package forwarder

import (
	"bufio"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/lb"
)

// TestSocketHandover: a successor forwarder built on the predecessor's
// sockets serves every new connection while the predecessor drains the
// ones it has: no connection is refused or dropped across the switch.
func TestSocketHandover(t *testing.T) {
	leakCheck(t)
	echo := startBackend(t, "echo", modeEcho)
	tcpFE := freeFrontend(t)
	udpFE := freeUDPFrontend(t)
	uecho := startUDPEcho(t, "u")
	store := lb.NewStore(lb.StoreOptions{})
	snap, err := store.Replace([]lb.Service{service("tcp", tcpFE, echo.addr), udpService("udp", udpFE, uecho.addr)})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Engine: testEngine, BindFrontends: true, Mark: -1, Workers: 2, DrainTimeout: 5 * time.Second, Logger: zap.NewNop()}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Apply(context.Background(), snap); err != nil {
		t.Fatal(err)
	}

	// A long-lived stream through a, and a steady stream of new connections.
	long := dial(t, tcpFE)
	defer long.Close()
	lr := bufio.NewReader(long)
	ping := func() error {
		if _, err := long.Write([]byte("ping\n")); err != nil {
			return err
		}
		_ = long.SetReadDeadline(time.Now().Add(3 * time.Second))
		_, err := lr.ReadString('\n')
		return err
	}
	if err := ping(); err != nil {
		t.Fatal(err)
	}
	stopLoad := connectionLoad(tcpFE, func(c net.Conn) error {
		if _, err := c.Write([]byte("x")); err != nil {
			return err
		}
		_, err := io.ReadFull(c, make([]byte, 1))
		return err
	})
	time.Sleep(100 * time.Millisecond)

	files, err := a.Sockets()
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 3 { // two TCP workers and the UDP socket
		t.Errorf("handed over %d sockets, want 3: %v", len(files), files)
	}
	cfg.Inherited = files
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown(context.Background())
	if err := b.Apply(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(b.m.ListenErrors); n != 0 {
		t.Fatalf("successor had %v listen errors: it bound anew instead of inheriting", n)
	}
	shutdownDone := make(chan struct{})
	go func() { _ = a.Shutdown(context.Background()); close(shutdownDone) }()

	time.Sleep(200 * time.Millisecond)
	if err := ping(); err != nil { // a's connection is still served while a drains
		t.Fatalf("long-lived connection broke at the handover: %v", err)
	}
	if reply, err := query(t, udpFE, []byte("q")); err != nil || string(reply) != "u q" {
		t.Fatalf("UDP after the handover: %q, %v", reply, err)
	}
	long.Close()
	<-shutdownDone
	done, failed := stopLoad()
	if failed != 0 {
		t.Fatalf("%d of %d connections failed across the handover", failed, done)
	}
	t.Logf("%d connections across the handover, none failed", done)
}
