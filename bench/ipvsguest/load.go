package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/svcproxy/svcproxy/internal/vmtest"
)

// bodySize is every response's body: 1 KiB, as the bench's keep-alive test.
const bodySize = 1024

var (
	respKeepAlive = []byte("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: " + strconv.Itoa(bodySize) + "\r\n\r\n" + strings.Repeat("x", bodySize))
	respClose     = []byte("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nConnection: close\r\nContent-Length: " + strconv.Itoa(bodySize) + "\r\n\r\n" + strings.Repeat("x", bodySize))
	reqKeepAlive  = []byte("GET /1k HTTP/1.1\r\nHost: bench\r\n\r\n")
	reqClose      = []byte("GET /1k HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
)

// server is a minimal HTTP/1.1 server: every request gets the 1 KiB
// response; "Connection: close" gets it and the server closes first, as
// nginx does for wrk's new-connection test.
type server struct {
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func startServer(h vmtest.GuestHost, port uint16) (*server, error) {
	s := &server{conns: map[net.Conn]struct{}{}}
	if err := vmtest.InNetNS(h.NS, func() error {
		var err error
		s.ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", port))
		return err
	}); err != nil {
		return nil, err
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := s.ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns[c] = struct{}{}
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.serve(c)
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
			}()
		}
	}()
	return s, nil
}

func (s *server) serve(c net.Conn) {
	defer c.Close()
	rd := bufio.NewReaderSize(c, 4096)
	for {
		closeAfter := false
		for first := true; ; first = false {
			line, err := rd.ReadSlice('\n')
			if err != nil {
				return
			}
			if len(bytes.TrimSpace(line)) == 0 {
				if first {
					continue // a stray CRLF between requests
				}
				break
			}
			if bytes.HasPrefix(bytes.ToLower(line), []byte("connection: close")) {
				closeAfter = true
			}
		}
		resp := respKeepAlive
		if closeAfter {
			resp = respClose
		}
		if _, err := c.Write(resp); err != nil || closeAfter {
			return
		}
	}
}

func (s *server) close() {
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// readResponse reads one response off rd and checks it is the 1 KiB 200.
func readResponse(rd *bufio.Reader) error {
	status, err := rd.ReadSlice('\n')
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(status, []byte("HTTP/1.1 200 ")) {
		return fmt.Errorf("status %q", bytes.TrimSpace(status))
	}
	n := -1
	for {
		line, err := rd.ReadSlice('\n')
		if err != nil {
			return err
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			break
		}
		if v, ok := bytes.CutPrefix(bytes.ToLower(line), []byte("content-length:")); ok {
			n, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
		}
	}
	if n != bodySize {
		return fmt.Errorf("content length %d, want %d", n, bodySize)
	}
	_, err = rd.Discard(n)
	return err
}

// dial connects from h to target; the socket lives in h's namespace.
func dial(ctx context.Context, h vmtest.GuestHost, target netip.AddrPort) (net.Conn, error) {
	var c net.Conn
	err := vmtest.InNetNS(h.NS, func() error {
		var err error
		d := net.Dialer{Timeout: 2 * time.Second}
		c, err = d.DialContext(ctx, "tcp4", target.String())
		return err
	})
	return c, err
}

// request makes one request on a new connection from h to target.
func request(ctx context.Context, h vmtest.GuestHost, target netip.AddrPort) error {
	c, err := dial(ctx, h, target)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write(reqClose); err != nil {
		return err
	}
	return readResponse(bufio.NewReader(c))
}

// loadResult is what one load test measured.
type loadResult struct {
	Requests int64
	Elapsed  time.Duration
	Errors   map[string]int64
	Latency  []time.Duration // sorted; the keep-alive test's only
}

func (l *loadResult) rate() float64 { return float64(l.Requests) / l.Elapsed.Seconds() }

func (l *loadResult) percentile(p float64) time.Duration {
	if len(l.Latency) == 0 {
		return 0
	}
	i := int(p/100*float64(len(l.Latency))+0.999999) - 1
	return l.Latency[max(0, min(len(l.Latency)-1, i))]
}

func (l *loadResult) errorCount() int64 {
	var n int64
	for _, v := range l.Errors {
		n += v
	}
	return n
}

// errKind names an error for the counts: connect, read, write, timeout,
// reset, status.
func errKind(op string, err error) string {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED):
		if op == "connect" {
			return "connect"
		}
		return "reset"
	}
	return op
}

type errCounts struct {
	mu sync.Mutex
	m  map[string]int64
}

func (e *errCounts) add(kind string) {
	e.mu.Lock()
	if e.m == nil {
		e.m = map[string]int64{}
	}
	e.m[kind]++
	e.mu.Unlock()
}

// keepAlive sends requests over conns keep-alive connections from h for d,
// one request in flight on each.
func keepAlive(ctx context.Context, h vmtest.GuestHost, target netip.AddrPort, conns int, d time.Duration) (*loadResult, error) {
	cs := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	for range conns {
		c, err := dial(ctx, h, target)
		if err != nil {
			return nil, fmt.Errorf("opening the keep-alive connections: %w", err)
		}
		cs = append(cs, c)
	}
	var errs errCounts
	var total atomic.Int64
	lats := make([][]time.Duration, conns)
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rd := bufio.NewReaderSize(c, 4096)
			lat := make([]time.Duration, 0, 4096)
			c.SetDeadline(deadline.Add(2 * time.Second))
			for {
				t0 := time.Now()
				if !t0.Before(deadline) || ctx.Err() != nil {
					break
				}
				if _, err := c.Write(reqKeepAlive); err != nil {
					errs.add(errKind("write", err))
					break
				}
				if err := readResponse(rd); err != nil {
					errs.add(errKind("read", err))
					break
				}
				lat = append(lat, time.Since(t0))
			}
			total.Add(int64(len(lat)))
			lats[i] = lat
		}()
	}
	wg.Wait()
	res := &loadResult{Requests: total.Load(), Elapsed: time.Since(start), Errors: errs.m}
	for _, l := range lats {
		res.Latency = append(res.Latency, l...)
	}
	slices.Sort(res.Latency)
	return res, ctx.Err()
}

// connRate makes a new connection per request from h for d, conns at a
// time, each closed once its response is in (Connection: close: the server
// closes too).
func connRate(ctx context.Context, h vmtest.GuestHost, target netip.AddrPort, conns int, d time.Duration) (*loadResult, error) {
	var errs errCounts
	var total atomic.Int64
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := bufio.NewReaderSize(nil, 4096)
			for time.Now().Before(deadline) && ctx.Err() == nil {
				c, err := dial(ctx, h, target)
				if err != nil {
					errs.add(errKind("connect", err))
					time.Sleep(10 * time.Millisecond) // no tight loop against a refusing target
					continue
				}
				c.SetDeadline(time.Now().Add(3 * time.Second))
				buf.Reset(c)
				if _, err := c.Write(reqClose); err != nil {
					errs.add(errKind("write", err))
				} else if err := readResponse(buf); err != nil {
					errs.add(errKind("read", err))
				} else {
					total.Add(1)
				}
				c.Close() // as wrk does once a Connection: close response is in
			}
		}()
	}
	wg.Wait()
	return &loadResult{Requests: total.Load(), Elapsed: time.Since(start), Errors: errs.m}, ctx.Err()
}

// cpuBusy is the busy time of every CPU of the VM so far (/proc/stat: all
// but idle and iowait), in seconds.
func cpuBusy() (float64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var busy int64
	for i, s := range f[1:] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, err
		}
		if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest time is already in user
			continue
		}
		busy += v
	}
	return float64(busy) / 100, nil // USER_HZ
}

// synRetrans is TcpExt TCPSynRetrans of h's namespace.
func synRetrans(h vmtest.GuestHost) (int64, error) {
	var out int64
	err := vmtest.InNetNS(h.NS, func() error {
		b, err := os.ReadFile("/proc/thread-self/net/netstat")
		if err != nil {
			return err
		}
		out, err = netstatValue(string(b), "TcpExt", "TCPSynRetrans")
		return err
	})
	return out, err
}

// netstatValue reads one counter from /proc/net/netstat or snmp text: a
// header line "Proto: names..." followed by "Proto: values...".
func netstatValue(text, proto, name string) (int64, error) {
	lines := strings.Split(text, "\n")
	for i := 0; i+1 < len(lines); i++ {
		h, v := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(h) == 0 || h[0] != proto+":" || len(v) != len(h) || v[0] != proto+":" {
			continue
		}
		for j, n := range h {
			if n == name {
				return strconv.ParseInt(v[j], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no %s %s counter", proto, name)
}
