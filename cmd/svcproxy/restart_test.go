package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/handover"
)

// TestTakeOver: a starting svcproxy binds anew only when no predecessor
// runs; one that answers but will not hand over makes it give up rather
// than serve beside it.
func TestTakeOver(t *testing.T) {
	// mute answers at path and closes every connection at once: a
	// predecessor that is there but hands nothing over. It stops after
	// accepting limit connections (0: never), leaving no socket file.
	mute := func(t *testing.T, path string, limit int) {
		ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			defer ln.Close()
			for n := 1; ; n++ {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
				if n == limit {
					return
				}
			}
		}()
	}
	for _, tc := range []struct {
		name    string
		setup   func(t *testing.T, path string) // the predecessor, if any
		off     bool                            // --handover-socket=""
		files   int                             // sockets taken over
		wantErr string
	}{
		{name: "off", off: true},
		{name: "nothing at the path", setup: func(*testing.T, string) {}},
		{name: "a stale socket file", setup: func(t *testing.T, path string) {
			ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
			if err != nil {
				t.Fatal(err)
			}
			ln.SetUnlinkOnClose(false)
			ln.Close()
			if _, err := os.Stat(path); err != nil {
				t.Fatalf("the stale socket file is gone: %v", err)
			}
		}},
		{name: "a predecessor that answers and never hands over",
			setup:   func(t *testing.T, path string) { mute(t, path, 0) },
			wantErr: "refusing to serve beside it"},
		{name: "a predecessor that fails once and goes away",
			setup: func(t *testing.T, path string) { mute(t, path, 1) }},
		{name: "a predecessor that hands over", files: 1, setup: func(t *testing.T, path string) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			srv, err := handover.Listen(path)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			go func() {
				defer srv.Close()
				_ = srv.Serve(ctx, func() (map[string]*os.File, error) {
					f, err := ln.(*net.TCPListener).File()
					return map[string]*os.File{"tcp/127.0.0.1:1": f}, err
				}, func() {})
			}()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "handover.sock")
			if tc.setup != nil {
				tc.setup(t, path)
			}
			if tc.off {
				path = ""
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			s, files, err := takeOver(ctx, path, 1500*time.Millisecond, zap.NewNop())
			for _, f := range files {
				defer f.Close()
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("takeOver: %v, want an error saying %q", err, tc.wantErr)
				}
				if d := time.Since(start); d < 1500*time.Millisecond {
					t.Errorf("gave up after %v, before its patience (1.5s) ran out", d)
				}
				return
			}
			if err != nil {
				t.Fatalf("takeOver: %v", err)
			}
			if len(files) != tc.files {
				t.Fatalf("took over %d sockets, want %d", len(files), tc.files)
			}
			if tc.files > 0 {
				if err := s.from.Ready(ctx); err != nil {
					t.Fatalf("telling the predecessor: %v", err)
				}
			}
		})
	}
}
