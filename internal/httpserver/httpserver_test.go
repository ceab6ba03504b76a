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
	t.Cleanup(func() { s.Close() })
	return s, ln.Addr().String()
}

// waitPending waits until s has n connections with a request to answer.
func waitPending(t *testing.T, s *Server, n int) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); s.Pending() != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections pending, want %d", s.Pending(), n)
		}
	}
}

// accepted dials s and waits until s has accepted the connection (s has no
// other pending one).
func accepted(t *testing.T, s *Server, addr string) net.Conn {
	t.Helper()
	waitPending(t, s, 0)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	waitPending(t, s, 1)
	return c
}

// ask sends a request on c and reads the answer, and whether it asked to
// close the connection.
func ask(c net.Conn, r *bufio.Reader) (body string, closing bool, err error) {
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return "", false, err
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return "", false, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), resp.Close, err
}

// refused waits until addr refuses connections.
func refused(t *testing.T, addr string) bool {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return true
		}
		c.Close()
	}
	return false
}

// TestStopAnswersWhatItAccepted: with two servers stopping together, a
// connection each accepted before Stop whose request comes after Stop
// began is answered, with Connection: close (an http.Server shutting down
// would drop it); both listeners close at once; Stop returns once they
// are answered.
func TestStopAnswersWhatItAccepted(t *testing.T) {
	s1, addr1 := listen(t)
	s2, addr2 := listen(t)
	c1, c2 := accepted(t, s1, addr1), accepted(t, s2, addr2)
	stopped := make(chan struct{})
	go func() { Stop(context.Background(), s1, s2); close(stopped) }()
	for _, addr := range []string{addr1, addr2} {
		if !refused(t, addr) {
			t.Errorf("%s still accepts after Stop began", addr)
		}
	}
	select {
	case <-stopped:
		t.Fatal("Stop returned with requests to answer")
	default:
	}
	for i, c := range []net.Conn{c1, c2} {
		body, closing, err := ask(c, bufio.NewReader(c))
		if err != nil || body != "ok" || !closing {
			t.Errorf("server %d, the request of a connection accepted before Stop: %q, close %v, %v; want ok, closing", i+1, body, closing, err)
		}
	}
	select {
	case <-stopped:
	case <-time.After(2 * time.Second):
		t.Fatal("Stop did not return once the requests were answered")
	}
}

// TestStopClosesIdleAndSilent: an idle keep-alive connection is closed
// without waiting for the rest; one that never sends its request is closed
// at ctx's deadline.
func TestStopClosesIdleAndSilent(t *testing.T) {
	s, addr := listen(t)
	idle := accepted(t, s, addr)
	if body, closing, err := ask(idle, bufio.NewReader(idle)); err != nil || body != "ok" || closing {
		t.Fatalf("first request: %q, close %v, %v", body, closing, err)
	}
	silent := accepted(t, s, addr) // waits for idle to be idle first
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	stopped := make(chan struct{})
	go func() { Stop(ctx, s); close(stopped) }()
	_ = idle.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := idle.Read(make([]byte, 1)); err == nil || n > 0 {
		t.Error("the idle keep-alive connection is still open while Stop waits")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Error("the idle keep-alive connection was not closed while Stop waits for the silent one")
	}
	select {
	case <-stopped:
		t.Error("Stop returned before the silent connection's deadline")
	case <-time.After(100 * time.Millisecond):
	}
	<-stopped
	_ = silent.SetReadDeadline(time.Now().Add(time.Second))
	if n, err := silent.Read(make([]byte, 1)); err == nil || n > 0 {
		t.Error("the silent connection is still open after Stop")
	}
}
