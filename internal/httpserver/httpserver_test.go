package httpserver

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

func listen(t *testing.T) (*Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), func(err error) { t.Errorf("Serve: %v", err) })
	return s, ln.Addr().String()
}

// accepted dials s and waits until s has accepted the connection.
func accepted(t *testing.T, s *Server, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	for deadline := time.Now().Add(2 * time.Second); s.Pending() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the connection was not accepted")
		}
	}
	return c
}

func ask(c net.Conn) (string, error) {
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestStopAnswersWhatItAccepted: a connection accepted before Stop whose
// request comes after Stop began is answered (an http.Server shutting down
// would drop it); the listener is closed at once; Stop returns once it is
// answered.
func TestStopAnswersWhatItAccepted(t *testing.T) {
	s, addr := listen(t)
	c := accepted(t, s, addr)
	stopped := make(chan struct{})
	go func() { s.Stop(context.Background()); close(stopped) }()
	time.Sleep(50 * time.Millisecond)
	if c2, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c2.Close()
		t.Error("the listener still accepts after Stop began")
	}
	select {
	case <-stopped:
		t.Fatal("Stop returned with a request to answer")
	default:
	}
	if got, err := ask(c); err != nil || got != "ok" {
		t.Errorf("the request of a connection accepted before Stop: %q, %v; want ok", got, err)
	}
	select {
	case <-stopped:
	case <-time.After(2 * time.Second):
		t.Fatal("Stop did not return once the request was answered")
	}
}

// TestStopClosesIdleAndSilent: an idle keep-alive connection is closed at
// once; one that never sends its request is closed at ctx's deadline.
func TestStopClosesIdleAndSilent(t *testing.T) {
	s, addr := listen(t)
	idle := accepted(t, s, addr)
	if got, err := ask(idle); err != nil || got != "ok" {
		t.Fatalf("first request: %q, %v", got, err)
	}
	silent := accepted(t, s, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	s.Stop(ctx)
	if d := time.Since(start); d < 150*time.Millisecond || d > 2*time.Second {
		t.Errorf("Stop took %v with a silent connection, want about its 200ms deadline", d)
	}
	for name, c := range map[string]net.Conn{"idle": idle, "silent": silent} {
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		if n, err := c.Read(make([]byte, 1)); err == nil || n > 0 {
			t.Errorf("the %s connection is still open after Stop", name)
		}
	}
}
