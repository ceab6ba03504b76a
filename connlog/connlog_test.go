package connlog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gopkg.in/natefinch/lumberjack.v2"
)

var (
	start    = time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)
	client   = netip.MustParseAddrPort("10.0.0.7:51234")
	frontend = netip.MustParseAddrPort("10.96.0.10:443")
	backend1 = netip.MustParseAddrPort("10.1.0.5:8443")
	backend2 = netip.MustParseAddrPort("10.1.0.6:8443")
)

// twoAttempts is a connection whose first dial was refused and whose second
// connected.
func twoAttempts(id uint64) Record {
	r := Record{
		Start:       start,
		ID:          id,
		Protocol:    "TCP",
		Client:      client,
		Frontend:    frontend,
		Service:     "default/web:https",
		NAttempts:   2,
		Backend:     backend2,
		BytesIn:     517,
		BytesOut:    20480,
		Duration:    1503250 * time.Microsecond,
		CloseReason: "backend_eof",
	}
	r.Attempts[0] = Attempt{Backend: backend1, Latency: 210 * time.Microsecond, Err: syscall.ECONNREFUSED}
	r.Attempts[1] = Attempt{Backend: backend2, Latency: 187 * time.Microsecond}
	return r
}

func failed(id uint64) Record {
	return Record{
		Start:       start,
		ID:          id,
		Protocol:    "TCP",
		Client:      client,
		Frontend:    frontend,
		Service:     "default/web:https",
		CloseReason: "no_endpoints",
		Failed:      true,
	}
}

func tempPath(t testing.TB) string {
	return filepath.Join(t.TempDir(), "svcproxy", "connections.log")
}

func open(t testing.TB, opts Options) *Log {
	t.Helper()
	if opts.Path == "" && opts.out == nil {
		opts.Path = tempPath(t)
	}
	l, err := Open(opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func readLines(t testing.TB, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return splitLines(b)
}

func splitLines(b []byte) []string {
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines
}

// topKeys returns the keys of the JSON object line, in order, failing the
// test unless line is exactly one valid JSON object.
func topKeys(t testing.TB, line string) []string {
	t.Helper()
	if !json.Valid([]byte(line)) {
		t.Fatalf("not valid JSON: %s", line)
	}
	dec := json.NewDecoder(strings.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not a JSON object: %s", line)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// logged is a decoded line.
type logged struct {
	Time     string `json:"time"`
	ID       uint64 `json:"id"`
	Proto    string `json:"proto"`
	Client   string `json:"client"`
	Frontend string `json:"frontend"`
	Service  string `json:"service"`
	Attempts []struct {
		Backend   string  `json:"backend"`
		ConnectMS float64 `json:"connect_ms"`
		Error     *string `json:"error"`
	} `json:"attempts"`
	Backend    *string `json:"backend"`
	BytesIn    int64   `json:"bytes_in"`
	BytesOut   int64   `json:"bytes_out"`
	DurationMS float64 `json:"duration_ms"`
	Close      string  `json:"close"`
	Failed     *bool   `json:"failed"`
}

func decode(t testing.TB, line string) logged {
	t.Helper()
	var got logged
	dec := json.NewDecoder(strings.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("decoding %s: %v", line, err)
	}
	return got
}

// logAndRead writes recs through a Log on a temp file and returns the lines.
func logAndRead(t *testing.T, opts Options, recs ...Record) []string {
	t.Helper()
	opts.Path = tempPath(t)
	l := open(t, opts)
	for i := range recs {
		l.Log(&recs[i])
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return readLines(t, opts.Path)
}

// wantAttempt is an element of "attempts".
type wantAttempt struct {
	backend string
	ms      float64
	err     string // "": none
}

var (
	keysConnected = []string{"time", "id", "proto", "client", "frontend", "service", "attempts", "backend", "bytes_in", "bytes_out", "duration_ms", "close"}
	keysFailed    = []string{"time", "id", "proto", "client", "frontend", "service", "attempts", "bytes_in", "bytes_out", "duration_ms", "close", "failed"}
)

func TestGoldenLine(t *testing.T) {
	lines := logAndRead(t, Options{}, twoAttempts(42))
	want := `{"time":"2025-03-01T12:00:00.123456789Z","id":42,"proto":"TCP",` +
		`"client":"10.0.0.7:51234","frontend":"10.96.0.10:443","service":"default/web:https",` +
		`"attempts":[{"backend":"10.1.0.5:8443","connect_ms":0.21,"error":"connection refused"},` +
		`{"backend":"10.1.0.6:8443","connect_ms":0.187}],` +
		`"backend":"10.1.0.6:8443","bytes_in":517,"bytes_out":20480,"duration_ms":1503.25,` +
		`"close":"backend_eof"}`
	if len(lines) != 1 || lines[0] != want {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(lines, "\n"), want)
	}
}

func TestFormat(t *testing.T) {
	udp := Record{
		Start:       start.In(time.FixedZone("X", 3600)),
		ID:          7,
		Protocol:    "UDP",
		Client:      netip.MustParseAddrPort("[fd00::7]:5353"),
		Frontend:    netip.MustParseAddrPort("[fd00:96::a]:53"),
		Service:     "kube-system/kube-dns:dns",
		NAttempts:   1,
		Backend:     netip.MustParseAddrPort("[fd00:1::5]:53"),
		BytesIn:     40,
		BytesOut:    120,
		Duration:    1234567, // ns
		CloseReason: "idle_timeout",
	}
	udp.Attempts[0] = Attempt{Backend: udp.Backend, Latency: 1234567}

	allFailed := failed(8)
	allFailed.CloseReason = "dial_failed"
	allFailed.NAttempts = 2
	allFailed.Attempts[0] = Attempt{Backend: backend1, Latency: 250 * time.Millisecond, Err: errors.New("i/o timeout")}
	allFailed.Attempts[1] = Attempt{Backend: backend2, Latency: time.Millisecond, Err: syscall.ECONNREFUSED}

	noService := Record{Start: start, ID: 9, Protocol: "TCP", Client: client, Frontend: frontend, CloseReason: "error", Failed: true}

	tooMany := twoAttempts(10)
	tooMany.NAttempts = 99
	negative := twoAttempts(11)
	negative.NAttempts = -1

	escaped := twoAttempts(12)
	escaped.Service = "ns/we\"ird\n:p"

	zeroTime := twoAttempts(13)
	zeroTime.Start = time.Time{}

	for _, tc := range []struct {
		name     string
		rec      Record
		keys     []string
		time     string
		client   string
		service  string
		attempts []wantAttempt
		backend  string
		duration float64
		close    string
	}{
		{
			name: "refused then connected", rec: twoAttempts(1), keys: keysConnected,
			time: "2025-03-01T12:00:00.123456789Z", client: "10.0.0.7:51234", service: "default/web:https",
			attempts: []wantAttempt{{"10.1.0.5:8443", 0.21, "connection refused"}, {"10.1.0.6:8443", 0.187, ""}},
			backend:  "10.1.0.6:8443", duration: 1503.25, close: "backend_eof",
		},
		{
			name: "udp over ipv6, local time zone", rec: udp, keys: keysConnected,
			time: "2025-03-01T13:00:00.123456789+01:00", client: "[fd00::7]:5353", service: "kube-system/kube-dns:dns",
			attempts: []wantAttempt{{"[fd00:1::5]:53", 1.235, ""}},
			backend:  "[fd00:1::5]:53", duration: 1.235, close: "idle_timeout",
		},
		{
			name: "no endpoints", rec: failed(2), keys: keysFailed,
			time: "2025-03-01T12:00:00.123456789Z", client: "10.0.0.7:51234", service: "default/web:https",
			attempts: []wantAttempt{}, close: "no_endpoints",
		},
		{
			name: "every dial failed", rec: allFailed, keys: keysFailed,
			time: "2025-03-01T12:00:00.123456789Z", client: "10.0.0.7:51234", service: "default/web:https",
			attempts: []wantAttempt{{"10.1.0.5:8443", 250, "i/o timeout"}, {"10.1.0.6:8443", 1, "connection refused"}},
			close:    "dial_failed",
		},
		{
			name: "no service matched", rec: noService, keys: keysFailed,
			time: "2025-03-01T12:00:00.123456789Z", client: "10.0.0.7:51234", service: "",
			attempts: []wantAttempt{}, close: "error",
		},
		{
			name: "NAttempts clamped to the array", rec: tooMany, keys: keysConnected,
			time: "2025-03-01T12:00:00.123456789Z", client: "10.0.0.7:51234", service: "default/web:https",
			attempts: append([]wantAttempt{{"10.1.0.5:8443", 0.21, "connection refused"}, {"10.1.0.6:8443", 0.187, ""}},
				slices.Repeat([]wantAttempt{{"", 0, ""}}, MaxAttempts-2)...),
			backend: "10.1.0.6:8443", duration: 1503.25, close: "backend_eof",
		},
		{
			name: "negative NAttempts", rec: negative, keys: keysConnected,
			time: "2025-03-01T12:00:00.123456789Z", client: "10.0.0.7:51234", service: "default/web:https",
			attempts: []wantAttempt{}, backend: "10.1.0.6:8443", duration: 1503.25, close: "backend_eof",
		},
		{
			name: "service needing escapes", rec: escaped, keys: keysConnected,
			time: "2025-03-01T12:00:00.123456789Z", client: "10.0.0.7:51234", service: "ns/we\"ird\n:p",
			attempts: []wantAttempt{{"10.1.0.5:8443", 0.21, "connection refused"}, {"10.1.0.6:8443", 0.187, ""}},
			backend:  "10.1.0.6:8443", duration: 1503.25, close: "backend_eof",
		},
		{
			name: "zero start time still has a time", rec: zeroTime, keys: keysConnected,
			time: "0001-01-01T00:00:00Z", client: "10.0.0.7:51234", service: "default/web:https",
			attempts: []wantAttempt{{"10.1.0.5:8443", 0.21, "connection refused"}, {"10.1.0.6:8443", 0.187, ""}},
			backend:  "10.1.0.6:8443", duration: 1503.25, close: "backend_eof",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lines := logAndRead(t, Options{}, tc.rec)
			if len(lines) != 1 {
				t.Fatalf("got %d lines, want 1:\n%s", len(lines), strings.Join(lines, "\n"))
			}
			line := lines[0]
			if keys := topKeys(t, line); !slices.Equal(keys, tc.keys) {
				t.Errorf("keys: got %v, want %v\nline: %s", keys, tc.keys, line)
			}
			got := decode(t, line)
			if got.Time != tc.time || got.ID != tc.rec.ID || got.Proto != tc.rec.Protocol ||
				got.Client != tc.client || got.Service != tc.service || got.Close != tc.close ||
				got.BytesIn != tc.rec.BytesIn || got.BytesOut != tc.rec.BytesOut || got.DurationMS != tc.duration {
				t.Errorf("got %+v\nline: %s", got, line)
			}
			var gotAttempts []wantAttempt
			for _, a := range got.Attempts {
				e := ""
				if a.Error != nil {
					e = *a.Error
				}
				gotAttempts = append(gotAttempts, wantAttempt{a.Backend, a.ConnectMS, e})
			}
			if !slices.Equal(gotAttempts, tc.attempts) {
				t.Errorf("attempts: got %v, want %v", gotAttempts, tc.attempts)
			}
			if !strings.Contains(line, `"attempts":[`) {
				t.Errorf("attempts is not an array: %s", line)
			}
			// error is omitted, not empty, on a successful attempt.
			if n := strings.Count(line, `"error":`); n != countErrs(tc.attempts) {
				t.Errorf(`got %d "error" keys, want %d: %s`, n, countErrs(tc.attempts), line)
			}
			gotBackend := ""
			if got.Backend != nil {
				gotBackend = *got.Backend
			}
			if gotBackend != tc.backend {
				t.Errorf("backend: got %q, want %q", gotBackend, tc.backend)
			}
			if (got.Failed != nil) != tc.rec.Failed || (got.Failed != nil && !*got.Failed) {
				t.Errorf("failed: got %v, want only when true (%v)", got.Failed, tc.rec.Failed)
			}
		})
	}
}

func countErrs(as []wantAttempt) int {
	n := 0
	for _, a := range as {
		if a.err != "" {
			n++
		}
	}
	return n
}

func TestMillisRounding(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want float64
	}{
		{0, 0},
		{1234567, 1.235},
		{1234499, 1.234},
		{999, 0.001},
		{499, 0},
		{time.Hour, 3600000},
		{-1500 * time.Microsecond, -1.5},
	} {
		if got := millis(tc.d); got != tc.want {
			t.Errorf("millis(%v): got %v, want %v", tc.d, got, tc.want)
		}
	}
}

func TestSampling(t *testing.T) {
	for _, tc := range []struct {
		every   int
		ids     []uint64 // successful records logged
		fails   []uint64 // failed records logged
		wantIDs []uint64 // in order of logging
	}{
		{every: 0, ids: []uint64{1, 2, 3}, wantIDs: []uint64{1, 2, 3}},
		{every: 1, ids: []uint64{1, 2, 3}, wantIDs: []uint64{1, 2, 3}},
		{every: 3, ids: []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, wantIDs: []uint64{3, 6, 9}},
		{every: 3, ids: []uint64{1, 2, 3}, fails: []uint64{4, 5, 7}, wantIDs: []uint64{3, 4, 5, 7}},
		{every: 1000, ids: []uint64{0, 1, 999, 1000, 1001, 2000}, fails: []uint64{1, 2}, wantIDs: []uint64{0, 1000, 2000, 1, 2}},
	} {
		t.Run(fmt.Sprintf("every=%d", tc.every), func(t *testing.T) {
			t.Parallel()
			var recs []Record
			for _, id := range tc.ids {
				recs = append(recs, twoAttempts(id))
			}
			for _, id := range tc.fails {
				recs = append(recs, failed(id))
			}
			lines := logAndRead(t, Options{SampleEvery: tc.every}, recs...)
			var got []uint64
			for _, line := range lines {
				got = append(got, decode(t, line).ID)
			}
			if !slices.Equal(got, tc.wantIDs) {
				t.Errorf("ids logged: got %v, want %v", got, tc.wantIDs)
			}
		})
	}

	t.Run("Sampled agrees", func(t *testing.T) {
		l := open(t, Options{SampleEvery: 4})
		for id, want := range map[uint64]bool{0: true, 1: false, 3: false, 4: true, 6: false, 8: true} {
			if got := l.Sampled(id); got != want {
				t.Errorf("Sampled(%d): got %v, want %v", id, got, want)
			}
		}
	})
}

// stall makes the writer goroutine block before encoding its first record
// until release is called; entered is signalled once it has blocked.
type stall struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newStall() *stall {
	return &stall{entered: make(chan struct{}, 1), release: make(chan struct{})}
}

func (s *stall) hook() {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-s.release
}

func (s *stall) Release() { s.once.Do(func() { close(s.release) }) }

// waitEntered waits until the writer goroutine is blocked in the hook.
func (s *stall) waitEntered(t testing.TB) {
	t.Helper()
	select {
	case <-s.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("writer goroutine never took a record")
	}
}

func TestQueueFullDrops(t *testing.T) {
	for _, tc := range []struct {
		name   string
		queue  int
		extra  int  // records logged once the queue is full
		failed bool // they are failed ones (never sampled out)
	}{
		{name: "queue of 1", queue: 1, extra: 5},
		{name: "queue of 8", queue: 8, extra: 100},
		{name: "failed records too", queue: 4, extra: 7, failed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newStall()
			path := tempPath(t)
			l := open(t, Options{Path: path, QueueSize: tc.queue, beforeWrite: s.hook})
			t.Cleanup(s.Release)

			rec := twoAttempts(0)
			if tc.failed {
				rec = failed(0)
			}
			rec.ID = 1
			l.Log(&rec) // taken off the queue by the writer, which stalls on it
			s.waitEntered(t)

			done := make(chan struct{})
			go func() {
				defer close(done)
				for i := range tc.queue + tc.extra {
					rec.ID = uint64(2 + i)
					l.Log(&rec)
				}
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Log blocked on a full queue")
			}
			if got := l.Dropped(); got != uint64(tc.extra) {
				t.Errorf("Dropped: got %d, want %d", got, tc.extra)
			}

			s.Release()
			if err := l.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			want := 1 + tc.queue
			if got := l.Written(); got != uint64(want) {
				t.Errorf("Written: got %d, want %d", got, want)
			}
			lines := readLines(t, path)
			if len(lines) != want {
				t.Fatalf("got %d lines, want %d", len(lines), want)
			}
			// The oldest records are kept, in order; the newest were dropped.
			for i, line := range lines {
				if id := decode(t, line).ID; id != uint64(1+i) {
					t.Errorf("line %d: id %d, want %d", i, id, 1+i)
				}
			}
		})
	}
}

func withUmask(t *testing.T, mask int) {
	old := syscall.Umask(mask)
	t.Cleanup(func() { syscall.Umask(old) })
}

func mode(t testing.TB, path string) fs.FileMode {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return info.Mode().Perm()
}

// TestLumberjackRotationMode pins the lumberjack behaviour rotatingFile
// works around: a rotated file is created with the old file's mode
// filtered by the umask, so only a chmod after rotation guarantees 0640.
// Not parallel: the umask is per process.
func TestLumberjackRotationMode(t *testing.T) {
	for _, tc := range []struct {
		umask int
		want  fs.FileMode
	}{
		{umask: 0o022, want: 0o640},
		{umask: 0o077, want: 0o600},
	} {
		t.Run(fmt.Sprintf("umask=%03o", tc.umask), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "lj.log")
			if err := os.WriteFile(path, []byte("x\n"), 0o640); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, 0o640); err != nil {
				t.Fatal(err)
			}
			withUmask(t, tc.umask)
			lj := &lumberjack.Logger{Filename: path}
			defer lj.Close()
			if err := lj.Rotate(); err != nil {
				t.Fatal(err)
			}
			if got := mode(t, path); got != tc.want {
				t.Errorf("mode after lumberjack rotation: got %v, want %v", got, tc.want)
			}
		})
	}
}

// Not parallel: the umask is per process.
func TestFileMode(t *testing.T) {
	for _, tc := range []struct {
		name     string
		umask    int
		existing fs.FileMode // mode of a file already there; 0: none
	}{
		{name: "new file, umask 022", umask: 0o022},
		{name: "new file, umask 077", umask: 0o077},
		{name: "existing 0600 file, umask 022", umask: 0o022, existing: 0o600},
		{name: "existing 0666 file, umask 077", umask: 0o077, existing: 0o666},
	} {
		t.Run(tc.name, func(t *testing.T) {
			withUmask(t, tc.umask)
			dir := filepath.Join(t.TempDir(), "svcproxy")
			path := filepath.Join(dir, "connections.log")
			if tc.existing != 0 {
				if err := os.Mkdir(dir, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, nil, tc.existing); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(path, tc.existing); err != nil {
					t.Fatal(err)
				}
			}
			const maxBytes = 1024
			l := open(t, Options{Path: path, MaxBackups: -1, maxBytes: maxBytes})
			if got := mode(t, path); got != fileMode {
				t.Errorf("after Open: mode %v, want %v", got, fileMode)
			}
			if tc.existing == 0 {
				if got := mode(t, dir); got != dirMode {
					t.Errorf("directory created with mode %v, want %v", got, dirMode)
				}
			}

			const n = 50 // about 300 bytes each: a dozen rotations
			for i := range n {
				rec := twoAttempts(uint64(i))
				l.Log(&rec)
			}
			if err := l.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if l.Written() != n {
				t.Errorf("Written: got %d, want %d", l.Written(), n)
			}

			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) < 2 {
				t.Fatalf("no rotation happened: %v", entries)
			}
			for _, e := range entries {
				p := filepath.Join(dir, e.Name())
				if got := mode(t, p); got != fileMode {
					t.Errorf("%s: mode %v, want %v", e.Name(), got, fileMode)
				}
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				if len(b) > maxBytes {
					t.Errorf("%s: %d bytes, over the rotation size %d", e.Name(), len(b), maxBytes)
				}
				if len(b) > 0 && b[len(b)-1] != '\n' {
					t.Errorf("%s: a line was split across files", e.Name())
				}
				for _, line := range splitLines(b) {
					topKeys(t, line)
				}
			}
		})
	}
}

func TestCloseFlushes(t *testing.T) {
	for _, n := range []int{0, 1, 1000, 20000} {
		t.Run(fmt.Sprintf("records=%d", n), func(t *testing.T) {
			t.Parallel()
			path := tempPath(t)
			l := open(t, Options{Path: path, QueueSize: max(n, 1)})
			for i := range n {
				rec := twoAttempts(uint64(i))
				l.Log(&rec)
			}
			if err := l.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if l.Written() != uint64(n) || l.Dropped() != 0 {
				t.Errorf("Written %d, Dropped %d; want %d, 0", l.Written(), l.Dropped(), n)
			}
			if lines := readLines(t, path); len(lines) != n {
				t.Errorf("got %d lines, want %d", len(lines), n)
			}

			// After Close: dropped, counted, no panic; Close again is fine.
			rec := failed(1)
			l.Log(&rec)
			if l.Dropped() != 1 {
				t.Errorf("Log after Close: Dropped %d, want 1", l.Dropped())
			}
			if err := l.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
		})
	}
}

// TestFlushInterval checks that a record reaches the file within about a
// second without Close.
func TestFlushInterval(t *testing.T) {
	t.Parallel()
	path := tempPath(t)
	l := open(t, Options{Path: path})
	rec := twoAttempts(1)
	l.Log(&rec)
	deadline := time.Now().Add(5 * flushInterval)
	for {
		if lines := readLines(t, path); len(lines) == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("record not on disk after %v", 5*flushInterval)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestConcurrentLogAndClose(t *testing.T) {
	t.Parallel()
	path := tempPath(t)
	l := open(t, Options{Path: path, QueueSize: 64})
	const goroutines, each = 8, 2000
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			rec := twoAttempts(0)
			for i := range each {
				rec.ID = uint64(g*each + i)
				l.Log(&rec)
			}
		})
	}
	time.Sleep(time.Millisecond)
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	wg.Wait()
	if got := l.Written() + l.Dropped(); got != goroutines*each {
		t.Errorf("Written %d + Dropped %d = %d, want %d", l.Written(), l.Dropped(), got, goroutines*each)
	}
	if lines := readLines(t, path); len(lines) != int(l.Written()) {
		t.Errorf("got %d lines, Written says %d", len(lines), l.Written())
	}
}

func TestNilLog(t *testing.T) {
	var l *Log
	rec := twoAttempts(1)
	l.Log(&rec)
	l.Log(nil)
	if l.Sampled(0) {
		t.Error("nil Log: Sampled true")
	}
	if l.Dropped() != 0 || l.Written() != 0 {
		t.Error("nil Log: counters not zero")
	}
	if err := l.Close(); err != nil {
		t.Errorf("nil Log: Close: %v", err)
	}
}

func TestLogAllocs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  Options
		nilog bool
		close bool
	}{
		{name: "queued", opts: Options{QueueSize: 1000}},
		{name: "queue full", opts: Options{QueueSize: 1}},
		{name: "sampled out", opts: Options{SampleEvery: 1 << 30}},
		{name: "closed", close: true},
		{name: "nil", nilog: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l *Log
			if !tc.nilog {
				// The writer goroutine is held so that only Log is measured.
				s := newStall()
				tc.opts.beforeWrite = s.hook
				l = open(t, tc.opts)
				t.Cleanup(s.Release)
				rec := failed(1) // never sampled out
				l.Log(&rec)
				s.waitEntered(t)
				if tc.close {
					s.Release()
					l.Close()
				}
			}
			rec := twoAttempts(2)
			if got := testing.AllocsPerRun(100, func() { l.Log(&rec) }); got != 0 {
				t.Errorf("Log: %v allocs per call, want 0", got)
			}
		})
	}
}

// TestWriterAllocs guards the writer goroutine: encoding a record costs no
// allocation beyond what an attempt's error allocates to format itself.
// zap's encoder and buffers come from sync.Pools, which the race detector
// empties at random (5 of 300 runs of this test failed under -race),
// so it runs without -race: make test runs every *Allocs test that way too.
func TestWriterAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts through sync.Pool are not exact under -race; make test runs this without it")
	}
	for _, tc := range []struct {
		name string
		rec  Record
	}{
		{"two attempts", twoAttempts(1)},
		{"failed", failed(2)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts, err := Options{out: io.Discard}.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			w := newWriter(opts, opts.out, nil)
			w.l = &Log{}
			w.rec = tc.rec
			w.write() // initializes the buffer
			if got := testing.AllocsPerRun(100, w.write); got != 0 {
				t.Errorf("write: %v allocs per record, want 0", got)
			}
			if err := w.close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// flaky fails its first n writes.
type flaky struct {
	mu    sync.Mutex
	fails int
	buf   bytes.Buffer
}

func (f *flaky) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fails > 0 {
		f.fails--
		return 0, syscall.ENOSPC
	}
	return f.buf.Write(p)
}

func TestWriteErrorRecovers(t *testing.T) {
	t.Parallel()
	out := &flaky{fails: 3}
	// A 1-byte buffer hands every record to out as it is written.
	l := open(t, Options{out: out, bufSize: 1})
	for i := range 10 {
		rec := twoAttempts(uint64(i))
		l.Log(&rec)
	}
	err := l.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("Close: got %v, want the first write error", err)
	}
	if l.Written() != 7 || l.Dropped() != 3 {
		t.Errorf("Written %d, Dropped %d; want 7, 3", l.Written(), l.Dropped())
	}
	var ids []uint64
	for _, line := range splitLines(out.buf.Bytes()) {
		ids = append(ids, decode(t, line).ID)
	}
	if want := []uint64{3, 4, 5, 6, 7, 8, 9}; !slices.Equal(ids, want) {
		t.Errorf("ids written: got %v, want %v", ids, want)
	}
}

// Not parallel: replaces os.Stdout.
func TestStdout(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	old := os.Stdout
	os.Stdout = f
	l, err := Open(Options{Path: "-"})
	os.Stdout = old
	if err != nil {
		t.Fatal(err)
	}
	rec := twoAttempts(5)
	l.Log(&rec)
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	lines := readLines(t, f.Name())
	if len(lines) != 1 || decode(t, lines[0]).ID != 5 {
		t.Errorf("got %q", lines)
	}
	if _, err := f.Write(nil); err != nil {
		t.Errorf("Close closed stdout: %v", err)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	notADir := filepath.Join(dir, "file")
	if err := os.WriteFile(notADir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"negative MaxSizeMB", Options{Path: filepath.Join(dir, "a.log"), MaxSizeMB: -1}},
		{"negative SampleEvery", Options{Path: filepath.Join(dir, "a.log"), SampleEvery: -1}},
		{"negative QueueSize", Options{Path: filepath.Join(dir, "a.log"), QueueSize: -1}},
		{"parent is a file", Options{Path: filepath.Join(notADir, "a.log")}},
		{"path is a directory", Options{Path: dir}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Open(tc.opts)
			if err == nil {
				l.Close()
				t.Fatal("Open succeeded")
			}
		})
	}
}

func BenchmarkLog(b *testing.B) {
	b.Run("queued", func(b *testing.B) {
		l := open(b, Options{})
		rec := twoAttempts(1)
		b.ReportAllocs()
		for b.Loop() {
			l.Log(&rec)
		}
		b.ReportMetric(float64(l.Dropped())/float64(b.N), "drops/op")
	})
	b.Run("parallel", func(b *testing.B) {
		l := open(b, Options{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			rec := twoAttempts(1)
			for pb.Next() {
				l.Log(&rec)
			}
		})
		b.ReportMetric(float64(l.Dropped())/float64(b.N), "drops/op")
	})
	b.Run("queue full", func(b *testing.B) {
		s := newStall()
		l := open(b, Options{QueueSize: 1, beforeWrite: s.hook})
		b.Cleanup(s.Release)
		rec := twoAttempts(1)
		l.Log(&rec)
		s.waitEntered(b)
		l.Log(&rec)
		b.ReportAllocs()
		for b.Loop() {
			l.Log(&rec)
		}
	})
	b.Run("sampled out", func(b *testing.B) {
		l := open(b, Options{SampleEvery: 1 << 30})
		rec := twoAttempts(1)
		b.ReportAllocs()
		for b.Loop() {
			l.Log(&rec)
		}
	})
}

// BenchmarkEncode is the writer goroutine's cost per record, to a discarded
// output.
func BenchmarkEncode(b *testing.B) {
	for _, n := range []int{1, 4, MaxAttempts} {
		b.Run(fmt.Sprintf("attempts=%d", n), func(b *testing.B) {
			opts, _ := Options{out: io.Discard}.withDefaults()
			w := newWriter(opts, opts.out, nil)
			w.l = &Log{}
			w.rec = twoAttempts(1)
			w.rec.NAttempts = n
			for i := range n {
				w.rec.Attempts[i] = Attempt{Backend: backend1, Latency: time.Millisecond}
			}
			b.ReportAllocs()
			for b.Loop() {
				w.write()
			}
			w.close()
		})
	}
}
