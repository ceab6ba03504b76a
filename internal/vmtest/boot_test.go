package vmtest

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestBootSilentRetried: a guest that prints nothing of its own within
// SilentLimit is killed and booted once more; one that speaks is left to
// run; two silent boots end with errSilent. QEMU is replaced by a shell.
func TestBootSilentRetried(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("skipping: no sh")
	}
	for _, tc := range []struct {
		name    string
		scripts []string // one per boot
		wantErr error
		boots   int
	}{
		{"speaks at once", []string{"echo SeaBIOS; echo 'VMTEST PASS x'; sleep 0.3; echo 'VMTEST DONE'"}, nil, 1},
		{"speaks late, within the limit", []string{"echo SeaBIOS; sleep 0.1; echo 'VMTEST DONE'"}, nil, 1},
		{"hangs once", []string{"echo SeaBIOS; exec sleep 30", "echo 'VMTEST DONE'"}, nil, 2},
		{"hangs twice", []string{"echo SeaBIOS; exec sleep 30", "echo SeaBIOS; exec sleep 30"}, errSilent, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			boots := 0
			qemuCommand = func(ctx context.Context, _ string, _ ...string) *exec.Cmd {
				script := tc.scripts[min(boots, len(tc.scripts)-1)]
				boots++
				return exec.CommandContext(ctx, "sh", "-c", script)
			}
			t.Cleanup(func() { qemuCommand = exec.CommandContext })
			var notes []string
			out, err := bootRetrying(context.Background(), BootOptions{Timeout: 10 * time.Second, SilentLimit: 500 * time.Millisecond,
				Console: func(line string) {
					if strings.HasPrefix(line, "vmtest: ") {
						notes = append(notes, line)
					}
				}})
			if !errors.Is(err, tc.wantErr) && !(err == nil && tc.wantErr == nil) {
				t.Errorf("err = %v, want %v", err, tc.wantErr)
			}
			if boots != tc.boots {
				t.Errorf("%d boots, want %d", boots, tc.boots)
			}
			if (tc.boots == 2) != (len(notes) == 1) || (tc.boots == 2 && !strings.Contains(out, "booting again")) {
				t.Errorf("notes %q, console %q: want the retry said once it happened", notes, out)
			}
		})
	}
}
