package forwarder

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/svcproxy/svcproxy/lb"
)

// TestFirstByteTimeout: with a Service's FirstByteTimeout set, a backend
// that takes the client's bytes and sends nothing fails the connection (the
// client is reset, the backend charged a failure and cooled down, so the
// next connections go elsewhere); a backend that answers in time, a client
// that waits before speaking, and a backend that speaks first are not
// affected.
func TestFirstByteTimeout(t *testing.T) {
	const timeout = 200 * time.Millisecond
	for _, tc := range []struct {
		name      string
		mode      backendMode
		wait      time.Duration // before the client speaks
		wantReset bool
	}{
		{name: "stalled backend", mode: modeSink, wantReset: true},
		{name: "echo answers", mode: modeEcho},
		{name: "client waits before speaking", mode: modeEcho, wait: 2 * timeout},
		{name: "backend speaks first, then stalls", mode: modeNameThenSink},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leakCheck(t)
			fe := freeFrontend(t)
			be := startBackend(t, "b", tc.mode)
			svc := service("fb", fe, be.addr)
			svc.FirstByteTimeout = timeout
			h := newHarness(t, Config{}, svc)
			c := dial(t, fe)
			defer c.Close()
			r := bufio.NewReader(c)
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if tc.mode == modeNameThenSink {
				if line, err := r.ReadString('\n'); err != nil || line != "b\n" {
					t.Fatalf("greeting: %q, %v", line, err)
				}
			}
			time.Sleep(tc.wait)
			start := time.Now()
			if _, err := io.WriteString(c, "hello\n"); err != nil {
				t.Fatal(err)
			}
			backend := h.fwd.snap.Load().Route(lb.TCP, fe).Backends()[0]
			if tc.wantReset {
				_, err := r.ReadByte()
				if !errors.Is(err, syscall.ECONNRESET) {
					t.Fatalf("read %v, want a reset", err)
				}
				if d := time.Since(start); d < timeout || d > timeout+time.Second {
					t.Errorf("reset after %v, want about %v", d, timeout)
				}
				h.settle()
				if n := testutil.ToFloat64(h.m.closes[reasonFirstByte]); n != 1 {
					t.Errorf("closes_total{reason=first_byte_timeout} = %v, want 1", n)
				}
				if backend.Failures() != 1 || !backend.CoolingDown(time.Now()) {
					t.Errorf("backend failures %d, cooling down %v: want it charged", backend.Failures(), backend.CoolingDown(time.Now()))
				}
				return
			}
			if tc.mode == modeEcho {
				if line, err := r.ReadString('\n'); err != nil || line != "hello\n" {
					t.Fatalf("echo: %q, %v", line, err)
				}
			}
			time.Sleep(2 * timeout) // past the timeout: still open
			if _, err := io.WriteString(c, "again\n"); err != nil {
				t.Fatal(err)
			}
			if tc.mode == modeEcho {
				if line, err := r.ReadString('\n'); err != nil || line != "again\n" {
					t.Fatalf("echo after the timeout: %q, %v", line, err)
				}
			}
			c.Close()
			h.settle()
			if n := testutil.ToFloat64(h.m.closes[reasonFirstByte]); n != 0 {
				t.Errorf("closes_total{reason=first_byte_timeout} = %v, want 0", n)
			}
			if n := backend.Failures(); n != 0 {
				t.Errorf("backend failures = %d, want 0", n)
			}
		})
	}
}

// TestStalledBackendAvoided measures what each picker does for a stalled
// backend (issue 15, finding 5): three backends, one of which accepts and
// then never answers, as a SIGSTOPped process does (its kernel still
// completes handshakes). 16 clients make one request per connection and
// give up after a second, for three seconds. Without a first-byte timeout
// round robin keeps sending it a third of the connections; least
// connections sees its connections pile up and mostly avoids it. With the
// Service's FirstByteTimeout it is charged and cooled down (1 s, then 2 s,
// ...): after the first second at most one probing connection per client
// reaches it.
func TestStalledBackendAvoided(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for seconds")
	}
	for _, tc := range []struct {
		algo      lb.Algorithm
		firstByte time.Duration
	}{
		{lb.RoundRobin, 0},
		{lb.LeastConn, 0},
		{lb.RoundRobin, 250 * time.Millisecond},
		{lb.LeastConn, 250 * time.Millisecond},
	} {
		t.Run(fmt.Sprintf("%v/firstByte=%v", tc.algo, tc.firstByte), func(t *testing.T) {
			leakCheck(t)
			fe := freeFrontend(t)
			a, b := startBackend(t, "a", modeEcho), startBackend(t, "b", modeEcho)
			stalled := startBackend(t, "stalled", modeSink)
			svc := service("web", fe, a.addr, b.addr, stalled.addr)
			svc.Algorithm = tc.algo
			svc.FirstByteTimeout = tc.firstByte
			h := newHarness(t, Config{IdleTimeout: 2 * time.Second}, svc)
			request := func() bool {
				c, err := net.DialTimeout("tcp", fe.String(), time.Second)
				if err != nil {
					return false
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(time.Second))
				if _, err := io.WriteString(c, "x\n"); err != nil {
					return false
				}
				line, err := bufio.NewReader(c).ReadString('\n')
				return err == nil && line == "x\n"
			}
			const clients = 16
			var mu sync.Mutex
			var okLate, failedEarly, failedLate int
			var wg sync.WaitGroup
			start := time.Now()
			for range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for time.Since(start) < 3*time.Second {
						ok := request()
						late := time.Since(start) > time.Second
						mu.Lock()
						switch {
						case late && ok:
							okLate++
						case late:
							failedLate++
						case !ok:
							failedEarly++
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			t.Logf("%v, first-byte timeout %v: %d requests failed in the first second; after it %d of %d (%.1f%%); the stalled backend accepted %d",
				tc.algo, tc.firstByte, failedEarly, failedLate, okLate+failedLate, 100*float64(failedLate)/float64(max(1, okLate+failedLate)), stalled.accepted.Load())
			if tc.firstByte > 0 && failedLate > clients {
				t.Errorf("%d requests failed after the first second, want at most one probe per client (%d)", failedLate, clients)
			}
			h.settle()
		})
	}
}
