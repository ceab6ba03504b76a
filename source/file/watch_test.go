package file

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/examples"
	"github.com/svcproxy/svcproxy/lb"
)

// servicesYAML returns a services file with one service per name, each
// with one endpoint.
func servicesYAML(names ...string) string {
	var b strings.Builder
	b.WriteString("services:\n")
	for i, name := range names {
		fmt.Fprintf(&b, "  - name: %s\n    clusterIP: 10.0.0.%d\n    ports: [{port: 80}]\n    endpoints: [{ip: 10.1.0.%d}]\n", name, i+1, i+1)
	}
	return b.String()
}

const brokenYAML = "services: [\n"

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// names lists the Service ports in snap.
func names(snap *lb.Snapshot) string {
	var out []string
	for _, b := range snap.Balancers() {
		out = append(out, b.Service.Name.String())
	}
	return strings.Join(out, ",")
}

type reload struct {
	services int
	err      error
}

// startWatcher runs w until the test ends and returns the channel its
// OnReload reports to.
func startWatcher(t *testing.T, w *Watcher) <-chan reload {
	t.Helper()
	reloads := make(chan reload, 100)
	w.OnReload = func(n int, err error) { reloads <- reload{n, err} }
	w.Logger = zaptest.NewLogger(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case r := <-reloads:
		if r.err != nil {
			t.Fatalf("first load: %v", r.err)
		}
	case err := <-done:
		t.Fatalf("Run returned early: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("no first load")
	}
	return reloads
}

// waitFor polls until snap's services are want, for up to 2s.
func waitFor(t *testing.T, store *lb.Store, want string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		got := names(store.Snapshot())
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("services: got %q, want %q within 2s", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestWatcherReloadsOnChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, path, servicesYAML("a"))
	store := lb.NewStore(lb.StoreOptions{})
	reloads := startWatcher(t, &Watcher{Path: path, Store: store})
	waitFor(t, store, "default/a")

	t.Run("write in place", func(t *testing.T) {
		writeFile(t, path, servicesYAML("a", "b"))
		waitFor(t, store, "default/a,default/b")
	})
	t.Run("rename over", func(t *testing.T) {
		tmp := path + ".tmp"
		writeFile(t, tmp, servicesYAML("c"))
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
		waitFor(t, store, "default/c")
	})
	t.Run("broken file keeps previous state", func(t *testing.T) {
		before := store.Snapshot()
		writeFile(t, path, brokenYAML)
		deadline := time.After(2 * time.Second)
		for {
			select {
			case r := <-reloads:
				if r.err == nil {
					continue
				}
				if !errors.Is(r.err, ErrInvalidFile) || r.services != 1 {
					t.Fatalf("OnReload(%d, %v), want (1, ErrInvalidFile)", r.services, r.err)
				}
				if after := store.Snapshot(); after != before {
					t.Fatalf("snapshot changed from version %d to %d after a broken file", before.Version, after.Version)
				}
				return
			case <-deadline:
				t.Fatal("no reload of the broken file within 2s")
			}
		}
	})
	t.Run("fixed file loads", func(t *testing.T) {
		writeFile(t, path, servicesYAML("d"))
		waitFor(t, store, "default/d")
	})
}

func TestWatcherSIGHUP(t *testing.T) {
	path := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, path, servicesYAML("a"))
	store := lb.NewStore(lb.StoreOptions{})
	reloads := startWatcher(t, &Watcher{Path: path, Store: store})
	version := store.Snapshot().Version

	// Run has called signal.Notify before its first load, so SIGHUP cannot
	// kill the test binary now.
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-reloads:
		if r.err != nil || r.services != 1 {
			t.Errorf("OnReload(%d, %v), want (1, nil)", r.services, r.err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no reload within 2s of SIGHUP")
	}
	if got := store.Snapshot().Version; got <= version {
		t.Errorf("snapshot version %d after SIGHUP, want > %d", got, version)
	}
}

// TestWatcherReload drives Reload directly, as SIGHUP does: a file with any
// problem applies nothing, and the error lists every problem with its line.
func TestWatcherReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "services.yaml")
	store := lb.NewStore(lb.StoreOptions{})
	var last reload
	reports := 0
	w := &Watcher{Path: path, Store: store, Logger: zaptest.NewLogger(t),
		OnReload: func(n int, err error) { last = reload{n, err}; reports++ }}

	const kept = "default/b,default/c"
	steps := []struct {
		name     string
		content  string   // "-" removes the file
		wantErr  error    // from Reload and OnReload; nil: none
		wantMsgs []string // each in the error
		want     string   // services afterwards
	}{
		{"load", servicesYAML("a", "b"), nil, nil, "default/a,default/b"},
		{"change", servicesYAML("b", "c"), nil, nil, kept},
		{"broken YAML keeps everything", brokenYAML, ErrInvalidFile, []string{"line 1:"}, kept},
		{"missing file keeps everything", "-", fs.ErrNotExist, nil, kept},
		{"unknown key in one service keeps everything", servicesYAML("b", "c") + "    weight: 2\n", nil,
			[]string{"line 10: services[1].weight: unknown key"}, kept},
		{"port 0 keeps everything", strings.Replace(servicesYAML("b", "c"), "port: 80", "port: 0", 1), nil,
			[]string{"line 4: services[0].ports[0].port: must be in 1-65535"}, kept},
		{"bad endpoint IP keeps everything", strings.Replace(servicesYAML("b", "c", "d"), "10.1.0.3", "10.1.0.300", 1), nil,
			[]string{`line 13: services[2].endpoints[0].ip: invalid IP address "10.1.0.300"`}, kept},
		{"every problem listed", strings.Replace(strings.Replace(servicesYAML("b", "c", "d"), "port: 80", "port: 0", 1), "name: d", "name: D", 1), nil,
			[]string{"line 4: services[0].ports[0].port", `line 10: services[2].name: "D" is not a valid name`}, kept},
		{"frontend conflict keeps everything", strings.Replace(servicesYAML("b", "c", "d"), "10.0.0.3", "10.0.0.2", 1), nil,
			[]string{"line 10: services[2]: frontend TCP/10.0.0.2:80 already belongs to default/c (line 6)"}, kept},
		{"empty file keeps everything", "\n", ErrInvalidFile, []string{`services: []`}, kept},
		{"truncated file keeps everything", servicesYAML("b", "c")[:40], nil,
			[]string{"line 2: services[0].ports: required", "line 3: services[0].clusterIP"}, kept},
		{"explicitly no services", "services: []\n", nil, nil, ""},
		{"services again", servicesYAML("a"), nil, nil, "default/a"},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if st.content == "-" {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
			} else {
				writeFile(t, path, st.content)
			}
			before, reportsBefore := store.Snapshot(), reports
			err := w.Reload()
			failing := st.wantErr != nil || st.wantMsgs != nil
			if (err != nil) != failing || (st.wantErr != nil && !errors.Is(err, st.wantErr)) {
				t.Fatalf("Reload: got %v, want an error: %v (%v)", err, failing, st.wantErr)
			}
			for _, msg := range st.wantMsgs {
				if !strings.Contains(err.Error(), msg) {
					t.Errorf("Reload error %q\nwant it to contain %q", err, msg)
				}
			}
			if got := names(store.Snapshot()); got != st.want {
				t.Errorf("services: got %q, want %q", got, st.want)
			}
			if err != nil && store.Snapshot() != before {
				t.Errorf("failed Reload published a new snapshot")
			}
			if reports != reportsBefore+1 || last.err != err || last.services != store.Snapshot().Len() {
				t.Errorf("OnReload: %d calls, last (%d, %v); want 1 call, (%d, the Reload error %v)",
					reports-reportsBefore, last.services, last.err, store.Snapshot().Len(), err)
			}
		})
	}
}

func TestWatcherFirstLoadFails(t *testing.T) {
	dir := t.TempDir()
	broken := filepath.Join(dir, "broken.yaml")
	writeFile(t, broken, brokenYAML)
	tests := []struct {
		name string
		w    *Watcher
		want error
	}{
		{"missing file", &Watcher{Path: filepath.Join(dir, "missing.yaml")}, fs.ErrNotExist},
		{"broken file", &Watcher{Path: broken}, ErrInvalidFile},
		{"broken data", &Watcher{Data: []byte(brokenYAML)}, ErrInvalidFile},
		{"empty data", &Watcher{Data: []byte{}}, ErrInvalidFile},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.w.Store = lb.NewStore(lb.StoreOptions{})
			tt.w.Logger = zaptest.NewLogger(t)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tt.w.Run(ctx); !errors.Is(err, tt.want) {
				t.Errorf("Run: got %v, want %v", err, tt.want)
			}
		})
	}
}

// TestWatcherFirstLoadListsEveryProblem: a file with problems at start is
// not served, and Run's error names every problem with its line.
func TestWatcherFirstLoadListsEveryProblem(t *testing.T) {
	path := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, path, strings.Replace(strings.Replace(servicesYAML("a", "b", "c"), "port: 80", "port: 0", 1), "clusterIP: 10.0.0.3", "clusterIp: 10.0.0.3", 1))
	store := lb.NewStore(lb.StoreOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := (&Watcher{Path: path, Store: store, Logger: zaptest.NewLogger(t)}).Run(ctx)
	for _, want := range []string{path, "line 4: services[0].ports[0].port: must be in 1-65535",
		"line 11: services[2].clusterIp: unknown key (did you mean clusterIP?)"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Run: got %v, want an error containing %q", err, want)
		}
	}
	if n := store.Snapshot().Len(); n != 0 {
		t.Errorf("the Store holds %d services after a failed first load, want 0", n)
	}
}

// TestWatcherRunAfterReload: Run does not load again what Reload has just
// applied (a daemon loads first, before anything starts), but does not
// take a failed Reload for a load either.
func TestWatcherRunAfterReload(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.yaml"), filepath.Join(dir, "bad.yaml")
	writeFile(t, good, servicesYAML("a"))
	writeFile(t, bad, "")
	for _, tt := range []struct {
		path    string
		wantErr bool
	}{{good, false}, {bad, true}} {
		t.Run(filepath.Base(tt.path), func(t *testing.T) {
			reports := 0
			w := &Watcher{Path: tt.path, Store: lb.NewStore(lb.StoreOptions{}), Logger: zaptest.NewLogger(t),
				OnReload: func(int, error) { reports++ }}
			if err := w.Reload(); (err != nil) != tt.wantErr {
				t.Fatalf("Reload: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			if err := w.Run(ctx); (err != nil) != tt.wantErr {
				t.Errorf("Run: %v, want an error: %v", err, tt.wantErr)
			}
			if want := map[bool]int{false: 1, true: 2}[tt.wantErr]; reports != want {
				t.Errorf("%d loads reported, want %d", reports, want)
			}
		})
	}
}

// TestDebouncer: a burst of changes is read once, quiet after its last
// change, or max after its first if it never goes quiet.
func TestDebouncer(t *testing.T) {
	const quiet, maxDelay = 200 * time.Millisecond, 2 * time.Second
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tests := []struct {
		name   string
		events []int // ms after t0
		due    int   // ms after t0
	}{
		{"one change", []int{0}, 200},
		{"a burst is read after its last change", []int{0, 5, 50, 190}, 390},
		{"truncate, then rewrite 150ms later", []int{0, 150}, 350},
		{"a burst that never goes quiet is read max after its first change", []int{0, 150, 300, 450, 600, 750, 900, 1050, 1200, 1350, 1500, 1650, 1800, 1950}, 2000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := debouncer{quiet: quiet, max: maxDelay}
			var wait time.Duration
			now := t0
			for _, ms := range tt.events {
				now = at(ms)
				wait = d.event(now)
			}
			if got := now.Add(wait); !got.Equal(at(tt.due)) {
				t.Errorf("due %v after the first change, want %v", got.Sub(t0), at(tt.due).Sub(t0))
			}
			// The timer may fire late; it is then due at once, and early
			// it must wait the rest.
			if w := d.wait(at(tt.due + 30)); w != 0 {
				t.Errorf("wait after the due time = %v, want 0", w)
			}
			if w := d.wait(at(tt.due - 30)); w != 30*time.Millisecond {
				t.Errorf("wait 30ms before the due time = %v, want 30ms", w)
			}
		})
	}
}

// TestWatcherReadsABurstOnce writes a file as a slow editor or a
// truncate-then-rewrite does — empty, then half, then whole — faster than
// Debounce: the Watcher reads it once, whole, and no failed load is seen.
func TestWatcherReadsABurstOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, path, servicesYAML("a"))
	store := lb.NewStore(lb.StoreOptions{})
	// A second of quiet: the writes below take microseconds, so only a
	// stalled machine could split them.
	reloads := startWatcher(t, &Watcher{Path: path, Store: store, Debounce: time.Second})

	full := servicesYAML("a", "b", "c")
	for _, content := range []string{"", full[:len(full)/2], full} {
		writeFile(t, path, content)
	}
	select {
	case r := <-reloads:
		if r.err != nil || r.services != 3 {
			t.Fatalf("OnReload(%d, %v) after the burst, want (3, nil): the burst was read before it ended", r.services, r.err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the burst was never read")
	}
	if got, want := names(store.Snapshot()), "default/a,default/b,default/c"; got != want {
		t.Errorf("services: got %q, want %q", got, want)
	}
	// Nothing else comes: touching the file with the same content again
	// is read but changes nothing, and reports nothing.
	writeFile(t, path, full)
	select {
	case r := <-reloads:
		t.Errorf("a second load, OnReload(%d, %v), after a write that changed nothing", r.services, r.err)
	case <-time.After(3 * time.Second):
	}
}

func TestWatcherEmbeddedData(t *testing.T) {
	store := lb.NewStore(lb.StoreOptions{})
	startWatcher(t, &Watcher{Data: examples.Services, Store: store})
	if got, want := names(store.Snapshot()), "demo/echo-sticky,demo/web"; got != want {
		t.Errorf("services: got %q, want %q", got, want)
	}
}
