//go:build linux

package daemon

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/handover"
)

// TestGuardCleanup: --cleanup is refused while a running svcproxy owns the
// rules — its handover socket answers, or the PID file names a running
// svcproxy — and the refusal says which; a stale socket file, a dead, a
// reaped-not or a reused PID does not count; --force goes ahead.
func TestGuardCleanup(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, "live.sock")
	srv, err := handover.Listen(live) // a running svcproxy's listener, as handover.Succession opens it
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: stale, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close() // the file stays, as after a crash

	// A fake /proc: 100 is a running svcproxy, 101 a zombie svcproxy, 102
	// a running shell (a PID reused); 103 does not exist.
	proc := filepath.Join(dir, "proc")
	for pid, files := range map[string]map[string]string{
		"self": {"comm": "svcproxy\n"},
		"100":  {"comm": "svcproxy\n", "status": "Name:\tsvcproxy\nState:\tS (sleeping)\n"},
		"101":  {"comm": "svcproxy\n", "status": "Name:\tsvcproxy\nState:\tZ (zombie)\n"},
		"102":  {"comm": "bash\n", "status": "Name:\tbash\nState:\tS (sleeping)\n"},
	} {
		for name, content := range files {
			writeTestFile(t, filepath.Join(proc, pid, name), content)
		}
	}
	pidFile := func(content string) string {
		path := filepath.Join(dir, "pid-"+strconv.Itoa(len(content))+"-"+strings.TrimSpace(content))
		writeTestFile(t, path, content)
		return path
	}
	failing := func(context.Context, string) (bool, error) { return false, errors.New("permission denied") }

	tests := []struct {
		name    string
		w       owner
		force   bool
		refused []string // each in the refusal; nil: allowed
	}{
		{"nothing there", owner{handoverSocket: filepath.Join(dir, "none.sock"), pidFile: filepath.Join(dir, "none.pid")}, false, nil},
		{"nothing looked at", owner{}, false, nil},
		{"a stale socket file", owner{handoverSocket: stale}, false, nil},
		{"a live handover socket", owner{handoverSocket: live}, false, []string{"its handover socket " + live + " answers a connect", "--force"}},
		{"a live handover socket, --force", owner{handoverSocket: live}, true, nil},
		{"the PID file names a running svcproxy", owner{pidFile: pidFile("100\n")}, false,
			[]string{"--pid-file " + filepath.Join(dir, "pid-4-100") + " names process 100 (svcproxy), which is running"}},
		{"the PID file names a zombie", owner{pidFile: pidFile("101\n")}, false, nil},
		{"the PID file names another program", owner{pidFile: pidFile("102\n")}, false, nil},
		{"the PID file names no process", owner{pidFile: pidFile("103\n")}, false, nil},
		{"the PID file is garbage", owner{pidFile: pidFile("svcproxy\n")}, false, nil},
		{"both", owner{handoverSocket: live, pidFile: pidFile("100")}, false, []string{"answers a connect; --pid-file"}},
		{"cannot tell", owner{handoverSocket: live, answers: failing}, false, []string{"could not tell", "permission denied"}},
		{"cannot tell, --force", owner{handoverSocket: live, answers: failing}, true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := tt.w
			if w.answers == nil {
				w.answers = handover.Answers
			}
			w.proc, w.self = proc, 1
			err := guardCleanup(context.Background(), w, tt.force, zaptest.NewLogger(t))
			if (err != nil) != (tt.refused != nil) {
				t.Fatalf("guardCleanup: %v, want refused: %v", err, tt.refused != nil)
			}
			for _, want := range tt.refused {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("refusal %q\ndoes not say %q", err, want)
				}
			}
		})
	}
}

// TestOwnerRealProc: the PID file check reads the real /proc: this test
// process, were it not itself, is a running process of its own program.
func TestOwnerRealProc(t *testing.T) {
	path := filepath.Join(t.TempDir(), "svcproxy.pid")
	writeTestFile(t, path, strconv.Itoa(os.Getpid())+"\n")
	w := owner{pidFile: path, proc: "/proc", self: -1}
	found, err := w.find(context.Background())
	if err != nil || !strings.Contains(found, "names process "+strconv.Itoa(os.Getpid())) {
		t.Errorf("find = %q, %v; want this process named", found, err)
	}
	w.self = os.Getpid()
	if found, _ := w.find(context.Background()); found != "" {
		t.Errorf("find = %q naming the process itself, want nothing", found)
	}
}

func writeTestFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
