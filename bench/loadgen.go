package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/svcproxy/svcproxy/internal/topology"
)

// Tool labels: every figure says which generator produced it.
const (
	toolWrk         = "wrk"
	toolIperf       = "iperf3"
	toolBuiltinHTTP = "built-in Go HTTP client"
	toolBuiltinBulk = "built-in Go stream reader"
)

// httpLoad is the outcome of an HTTP load test.
type httpLoad struct {
	Tool     string
	Requests int64
	Duration time.Duration
	Bytes    int64
	Errors   map[string]int64 // by kind: connect, read, write, timeout, status
	// Latency percentiles. With Connection: close, wrk's do not include the
	// connection handshake: read the rate, not the latency, from that test.
	P50, P90, P99, P999, Max time.Duration
}

func (l *httpLoad) rate() float64 { return float64(l.Requests) / l.Duration.Seconds() }

func (l *httpLoad) errorCount() int64 {
	var n int64
	for _, v := range l.Errors {
		n += v
	}
	return n
}

// wrkScript makes wrk print its summary as one JSON line, with the
// percentiles from its full-resolution histogram.
const wrkScript = `-- svcproxy bench: print the summary as JSON
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('BENCHJSON {"requests":%d,"duration_us":%d,"bytes":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,"p50":%d,"p90":%d,"p99":%d,"p999":%d,"max":%d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9), latency.max))
end
`

// runHTTPLoad sends GET path to target from h over conns connections for d:
// keep-alive, or a new connection per request when closeEach.
func runHTTPLoad(ctx context.Context, e *Env, h *topology.Host, target netip.AddrPort, path string, conns int, d time.Duration, closeEach bool) (*httpLoad, error) {
	if e.useWrk() {
		return runWrk(ctx, e, h, target, path, conns, d, closeEach)
	}
	return builtinHTTP(ctx, h, target, path, conns, d, closeEach)
}

func runWrk(ctx context.Context, e *Env, h *topology.Host, target netip.AddrPort, path string, conns int, d time.Duration, closeEach bool) (*httpLoad, error) {
	script := filepath.Join(e.Scratch, "summary.lua")
	if _, err := os.Stat(script); err != nil {
		if err := os.WriteFile(script, []byte(wrkScript), 0o644); err != nil {
			return nil, err
		}
	}
	args := []string{"-t", fmt.Sprint(min(2, conns)), "-c", fmt.Sprint(conns), "-d", fmt.Sprintf("%ds", int(d.Seconds())), "--timeout", "5s", "-s", script}
	if closeEach {
		args = append(args, "-H", "Connection: close")
	}
	args = append(args, fmt.Sprintf("http://%s%s", target, path))
	cmd := h.Command(ctx, e.Tools.Wrk, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("wrk %s: %v: %s", strings.Join(args, " "), err, lastLines(out, 5))
	}
	l, err := parseWrk(out)
	if err != nil {
		return nil, fmt.Errorf("wrk %s: %w", strings.Join(args, " "), err)
	}
	return l, nil
}

// parseWrk reads the BENCHJSON line wrkScript prints.
func parseWrk(out []byte) (*httpLoad, error) {
	i := bytes.Index(out, []byte("BENCHJSON "))
	if i < 0 {
		return nil, fmt.Errorf("no summary in its output: %s", lastLines(out, 5))
	}
	line, _, _ := bytes.Cut(out[i+len("BENCHJSON "):], []byte("\n"))
	var v struct {
		Requests, DurationUS, Bytes           int64
		Connect, Read, Write, Status, Timeout int64
		P50, P90, P99, P999, Max              int64
	}
	var raw map[string]int64
	if err := json.Unmarshal(line, &raw); err != nil {
		return nil, fmt.Errorf("parsing %q: %w", line, err)
	}
	v.Requests, v.DurationUS, v.Bytes = raw["requests"], raw["duration_us"], raw["bytes"]
	v.P50, v.P90, v.P99, v.P999, v.Max = raw["p50"], raw["p90"], raw["p99"], raw["p999"], raw["max"]
	if v.DurationUS <= 0 {
		return nil, fmt.Errorf("summary %q has no duration", line)
	}
	us := func(n int64) time.Duration { return time.Duration(n) * time.Microsecond }
	l := &httpLoad{
		Tool: toolWrk, Requests: v.Requests, Duration: us(v.DurationUS), Bytes: v.Bytes,
		Errors: map[string]int64{},
		P50:    us(v.P50), P90: us(v.P90), P99: us(v.P99), P999: us(v.P999), Max: us(v.Max),
	}
	for _, k := range []string{"connect", "read", "write", "status", "timeout"} {
		if raw[k] > 0 {
			l.Errors[k] = raw[k]
		}
	}
	return l, nil
}

func lastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// builtinHTTP is the fallback HTTP load generator: conns goroutines, each
// on a thread inside h's namespace, each with its own connection.
func builtinHTTP(ctx context.Context, h *topology.Host, target netip.AddrPort, path string, conns int, d time.Duration, closeEach bool) (*httpLoad, error) {
	req := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: bench\r\n", path)
	if closeEach {
		req += "Connection: close\r\n"
	}
	req += "\r\n"
	var (
		mu       sync.Mutex
		lats     []time.Duration
		requests atomic.Int64
		bytesIn  atomic.Int64
		errs     = map[string]int64{}
	)
	count := func(kind string) {
		mu.Lock()
		errs[kind]++
		mu.Unlock()
	}
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, 4096)
			_ = h.Do(func() error {
				var conn net.Conn
				var br *bufio.Reader
				defer func() {
					if conn != nil {
						conn.Close()
					}
				}()
				dialer := net.Dialer{Timeout: 5 * time.Second}
				for time.Now().Before(deadline) && ctx.Err() == nil {
					t0 := time.Now()
					if conn == nil {
						c, err := dialer.DialContext(ctx, "tcp", target.String())
						if err != nil {
							count("connect")
							time.Sleep(time.Millisecond)
							continue
						}
						conn, br = c, bufio.NewReaderSize(c, 64<<10)
					}
					_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
					if _, err := io.WriteString(conn, req); err != nil {
						count("write")
						conn.Close()
						conn = nil
						continue
					}
					resp, err := http.ReadResponse(br, nil)
					if err == nil {
						var n int64
						n, err = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						bytesIn.Add(n)
						if err == nil && resp.StatusCode != 200 {
							count("status")
						}
					}
					if err != nil {
						if errClass(err) == "timeout" {
							count("timeout")
						} else {
							count("read")
						}
						conn.Close()
						conn = nil
						continue
					}
					local = append(local, time.Since(t0))
					requests.Add(1)
					if closeEach || resp.Close {
						conn.Close()
						conn = nil
					}
				}
				return nil
			})
			mu.Lock()
			lats = append(lats, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l := &httpLoad{Tool: toolBuiltinHTTP, Requests: requests.Load(), Duration: time.Since(start), Bytes: bytesIn.Load(), Errors: errs}
	if len(lats) == 0 {
		return nil, fmt.Errorf("no request succeeded (errors %v)", errs)
	}
	slices.Sort(lats)
	pct := func(p float64) time.Duration {
		return lats[min(len(lats)-1, int(math.Ceil(p/100*float64(len(lats))))-1)]
	}
	l.P50, l.P90, l.P99, l.P999, l.Max = pct(50), pct(90), pct(99), pct(99.9), lats[len(lats)-1]
	return l, nil
}

// bulkLoad is the outcome of a bulk-throughput test.
type bulkLoad struct {
	Tool        string
	Bytes       int64
	Duration    time.Duration
	Retransmits int64 // iperf3's sender retransmits; -1 unknown
}

func (b *bulkLoad) gbps() float64 { return float64(b.Bytes) * 8 / b.Duration.Seconds() / 1e9 }

// runBulk streams data from the client for d over streams connections:
// iperf3 to target's iperf port, or the built-in reader downloading from
// the HTTP port.
func runBulk(ctx context.Context, e *Env, c *Cluster, run *Running, streams int, d time.Duration) (*bulkLoad, error) {
	client := c.Topo.Clients[0]
	if e.useIperf() {
		target := run.Targets[svcIperf]
		args := []string{"-c", target.Addr().String(), "-p", fmt.Sprint(target.Port()), "-t", fmt.Sprint(int(d.Seconds())), "-P", fmt.Sprint(streams), "-J"}
		out, err := client.Command(ctx, e.Tools.Iperf3, args...).Output()
		b, perr := parseIperf(out)
		if perr != nil {
			return nil, fmt.Errorf("iperf3 %s: %v: %w", strings.Join(args, " "), err, perr)
		}
		return b, nil
	}
	return builtinBulk(ctx, client, run.Targets[svcHTTP], c.paths().bulk, streams, d)
}

// parseIperf reads iperf3 -J output: the bytes the server received.
func parseIperf(out []byte) (*bulkLoad, error) {
	var v struct {
		Error string `json:"error"`
		End   struct {
			SumSent struct {
				Bytes       int64   `json:"bytes"`
				Seconds     float64 `json:"seconds"`
				Retransmits int64   `json:"retransmits"`
			} `json:"sum_sent"`
			SumReceived struct {
				Bytes   int64   `json:"bytes"`
				Seconds float64 `json:"seconds"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		return nil, fmt.Errorf("parsing its JSON: %v (%s)", err, lastLines(out, 3))
	}
	if v.Error != "" {
		return nil, errors.New(v.Error)
	}
	r := v.End.SumReceived
	if r.Bytes <= 0 || r.Seconds <= 0 {
		return nil, fmt.Errorf("no bytes received")
	}
	return &bulkLoad{Tool: toolIperf, Bytes: r.Bytes, Duration: time.Duration(r.Seconds * float64(time.Second)), Retransmits: v.End.SumSent.Retransmits}, nil
}

// builtinBulk downloads an endless HTTP body over streams connections for d.
func builtinBulk(ctx context.Context, h *topology.Host, target netip.AddrPort, path string, streams int, d time.Duration) (*bulkLoad, error) {
	var total atomic.Int64
	var firstErr error
	var once sync.Once
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := h.Do(func() error {
				dialer := net.Dialer{Timeout: 5 * time.Second}
				conn, err := dialer.DialContext(ctx, "tcp", target.String())
				if err != nil {
					return err
				}
				defer conn.Close()
				if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: bench\r\n\r\n", path); err != nil {
					return err
				}
				_ = conn.SetReadDeadline(deadline)
				buf := make([]byte, 256<<10)
				for {
					n, err := conn.Read(buf)
					total.Add(int64(n))
					if err != nil {
						if errClass(err) == "timeout" {
							return nil
						}
						return err
					}
				}
			})
			if err != nil {
				once.Do(func() { firstErr = err })
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	return &bulkLoad{Tool: toolBuiltinBulk, Bytes: total.Load(), Duration: time.Since(start), Retransmits: -1}, nil
}
