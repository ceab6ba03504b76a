//go:build linux

package handover

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestKeeper: a deposit replaces what the keeper holds; every worker that
// takes over gets the latest deposit and the keeper keeps serving; Close
// removes its socket file.
func TestKeeper(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "keeper.sock")
	k, err := ListenKeeper(path)
	if err != nil {
		t.Fatal(err)
	}
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go k.Serve(kctx)

	files := func(names ...string) map[string]*os.File {
		out := map[string]*os.File{}
		for _, n := range names {
			f, err := os.CreateTemp(dir, "sock")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			out[n] = f
		}
		return out
	}
	take := func() []string {
		t.Helper()
		h, err := Take(ctx, path)
		if err != nil {
			t.Fatalf("Take: %v", err)
		}
		var names []string
		for n, f := range h.Files {
			names = append(names, n)
			f.Close()
		}
		if err := h.Ready(ctx); err != nil {
			t.Fatalf("Ready: %v", err)
		}
		slices.Sort(names)
		return names
	}

	if got := take(); len(got) != 0 {
		t.Errorf("before any deposit a worker took %v, want nothing", got)
	}
	select {
	case <-k.Deposited():
		t.Error("Deposited closed before a deposit")
	default:
	}
	if err := Deposit(ctx, path, files("tcp/a", "udp/b")); err != nil {
		t.Fatal(err)
	}
	<-k.Deposited()
	if err := Deposit(ctx, path, files("tcp/a", "tcp/c")); err != nil {
		t.Fatal(err)
	}
	if names, n := k.Held(); n != 2 || len(names) != 2 {
		t.Errorf("Held() = %v after %d deposits, want 2 sockets after 2", names, n)
	}
	for range 2 { // the keeper serves worker after worker
		if got, want := take(), []string{"tcp/a", "tcp/c"}; !slices.Equal(got, want) {
			t.Errorf("a worker took %v, want the latest deposit %v", got, want)
		}
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the keeper's socket file is still there after Close: %v", err)
	}
	if err := Deposit(ctx, path, files("tcp/a")); err == nil {
		t.Error("a deposit after Close succeeded")
	}
}
