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

// TestWatcherReload drives Reload directly, as SIGHUP does.
func TestWatcherReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "services.yaml")
	store := lb.NewStore(lb.StoreOptions{})
	var last reload
	w := &Watcher{Path: path, Store: store, Logger: zaptest.NewLogger(t),
		OnReload: func(n int, err error) { last = reload{n, err} }}

	steps := []struct {
		name      string
		content   string // "" removes the file
		wantErr   error  // from Reload
		want      string // services afterwards
		wantSkips bool   // OnReload reports rejected services
	}{
		{"load", servicesYAML("a", "b"), nil, "default/a,default/b", false},
		{"change", servicesYAML("b", "c"), nil, "default/b,default/c", false},
		{"broken keeps previous", brokenYAML, ErrInvalidFile, "default/b,default/c", false},
		{"missing keeps previous", "", fs.ErrNotExist, "default/b,default/c", false},
		{"bad service skipped", servicesYAML("d", "E"), nil, "default/d", true},
		{"empty", "services: []\n", nil, "", false},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if st.content == "" {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
			} else {
				writeFile(t, path, st.content)
			}
			before := store.Snapshot()
			err := w.Reload()
			if !errors.Is(err, st.wantErr) || (err == nil) != (st.wantErr == nil) {
				t.Errorf("Reload: got %v, want %v", err, st.wantErr)
			}
			if got := names(store.Snapshot()); got != st.want {
				t.Errorf("services: got %q, want %q", got, st.want)
			}
			if err != nil && store.Snapshot() != before {
				t.Errorf("failed Reload published a new snapshot")
			}
			if last.services != store.Snapshot().Len() {
				t.Errorf("OnReload services = %d, want %d", last.services, store.Snapshot().Len())
			}
			if gotSkips := last.err != nil && err == nil; gotSkips != st.wantSkips {
				t.Errorf("OnReload error %v, want rejected services: %v", last.err, st.wantSkips)
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

func TestWatcherEmbeddedData(t *testing.T) {
	store := lb.NewStore(lb.StoreOptions{})
	startWatcher(t, &Watcher{Data: examples.Services, Store: store})
	if got, want := names(store.Snapshot()), "demo/echo-sticky,demo/web"; got != want {
		t.Errorf("services: got %q, want %q", got, want)
	}
}
