// Package httpserver owns an HTTP server on one listening socket that a
// successor process may share (a handed-over socket): Stop ends it without
// dropping a request it accepted. An http.Server that is shutting down
// closes a connection whose request it reads, unanswered; a client that
// connected just before, and whose connection this process rather than the
// successor accepted, would see the node fail (a load balancer's health
// check, a Prometheus scrape, a kubelet probe). Stop ends several at once.
package httpserver

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"
)

// Server serves one handler on one listener.
type Server struct {
	http *http.Server
	ln   net.Listener
	done chan struct{} // closed when Serve has returned

	mu      sync.Mutex
	pending map[net.Conn]bool // accepted connections with a request not yet answered
}

// Serve starts serving handler on ln. A failure other than the listener
// closing goes to failed (nil: ignored).
func Serve(ln net.Listener, handler http.Handler, failed func(error)) *Server {
	s := &Server{ln: ln, done: make(chan struct{}), pending: map[net.Conn]bool{}}
	s.http = &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second, ConnState: s.track}
	go func() {
		defer close(s.done)
		if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) && failed != nil {
			failed(err)
		}
	}()
	return s
}

// track is the http.Server's ConnState hook: a connection is pending from
// its accept until it is idle or closed.
func (s *Server) track(c net.Conn, st http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch st {
	case http.StateNew, http.StateActive:
		s.pending[c] = true
	default:
		delete(s.pending, c)
	}
}

// Pending counts the accepted connections with a request not yet answered.
func (s *Server) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

// Stop stops servers together: every listener closes first (a successor's
// copy of a socket stays open), so none accepts while another waits; then
// keep-alive ends (idle connections close, answers say Connection: close),
// every connection accepted until then is answered, and the servers shut
// down. Past ctx's deadline the rest are closed.
func Stop(ctx context.Context, servers ...*Server) {
	for _, s := range servers {
		_ = s.ln.Close()
	}
	for _, s := range servers {
		<-s.done // Serve returned: it accepts no more, and has tracked every connection it accepted
		s.http.SetKeepAlivesEnabled(false)
	}
	for _, s := range servers {
		for s.Pending() > 0 && ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	for _, s := range servers {
		if s.http.Shutdown(ctx) != nil {
			_ = s.http.Close()
		}
	}
}

// Close closes the listener and every connection at once.
func (s *Server) Close() error {
	_ = s.ln.Close() // also when Serve has not started yet
	return s.http.Close()
}
