package forwarder

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/lb"
)

// TestHandoverToMoreWorkers: a successor with more workers than its
// predecessor makes the redirect sockets it was not handed, but they
// listen only when it starts accepting. Until then the predecessor takes
// every connection (here, with no Service for the redirect address, it
// resets each at once); none waits in a socket nobody accepts.
func TestHandoverToMoreWorkers(t *testing.T) {
	if testEngine == EngineGoroutines {
		t.Skip("the goroutine engine's listeners listen as net.Listen makes them (a gap written in the closing note)")
	}
	leakCheck(t)
	snap, err := lb.NewStore(lb.StoreOptions{}).Replace(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Engine: testEngine, Redirect: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:0")}, Mark: -1, Workers: 1, Logger: zaptest.NewLogger(t)}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(a)
	if err := a.Apply(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	port := a.RedirectAddrs()[0]
	files, err := a.Sockets()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Workers, cfg.Inherited = 4, files
	b, err := New(cfg)
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(b)

	prompt := func(when string) {
		t.Helper()
		for i := range 40 {
			c, err := net.DialTimeout("tcp", port.String(), 2*time.Second)
			if errors.Is(err, syscall.ECONNRESET) {
				continue // taken and reset before the dial returned
			}
			if err != nil {
				t.Fatalf("%s: connection %d: %v", when, i, err)
			}
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err = c.Read(make([]byte, 1))
			c.Close()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("%s: connection %d was not taken within 2s", when, i)
			}
		}
	}
	prompt("before the successor accepts")
	if n := handsOver(t, b); n != 1 {
		t.Errorf("before it accepts, the successor hands over %d sockets, want 1 (the one it was handed)", n)
	}
	if err := b.Apply(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	shutdown(a)
	prompt("after the predecessor left")
	if n := handsOver(t, b); n != 4 {
		t.Errorf("accepting, the successor hands over %d sockets, want 4", n)
	}
}

// handsOver is how many sockets f would hand to a successor now.
func handsOver(t *testing.T, f *Forwarder) int {
	t.Helper()
	files, err := f.Sockets()
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range files {
		file.Close()
	}
	return len(files)
}
