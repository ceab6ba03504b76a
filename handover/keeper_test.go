//go:build linux

package handover

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
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
	select {
	case <-k.Deposits():
	default:
		t.Error("Deposits received nothing after two deposits")
	}
	if !k.Served(os.Getpid()) || k.Served(os.Getpid()+1) {
		t.Errorf("Served(this process) = %v, Served(another) = %v; want true, false (SO_PEERCRED)", k.Served(os.Getpid()), k.Served(os.Getpid()+1))
	}
	k.Forget(os.Getpid())
	if k.Served(os.Getpid()) {
		t.Error("Served after Forget")
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

// TestKeeperCloseLeavesAnothersFile: a keeper whose path another keeper
// has bound since leaves that one's socket file at Close.
func TestKeeperCloseLeavesAnothersFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keeper.sock")
	old, err := ListenKeeper(path)
	if err != nil {
		t.Fatal(err)
	}
	k, err := ListenKeeper(path) // replaces old's file, as a stale one
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	go k.Serve(t.Context())
	old.Close()
	if ok, err := Answers(t.Context(), path); err != nil || !ok {
		t.Errorf("after the first keeper's Close, the second's socket answers = %v, %v; want true", ok, err)
	}
}

// TestRemoveStaleKeepers: socket files nobody answers at go once old
// enough; a live keeper's, a young one and a file that is not a socket stay.
func TestRemoveStaleKeepers(t *testing.T) {
	dir := t.TempDir()
	stale := func(name string, age time.Duration) string {
		t.Helper()
		p := filepath.Join(dir, name)
		ln, err := listenPrivate(p)
		if err != nil {
			t.Fatal(err)
		}
		ln.SetUnlinkOnClose(false)
		ln.Close() // killed: the file stays, nobody listens
		then := time.Now().Add(-age)
		if err := os.Chtimes(p, then, then); err != nil {
			t.Fatal(err)
		}
		return p
	}
	old := stale("x-keeper-1.sock", time.Hour)
	young := stale("x-keeper-2.sock", 0)
	legacy := stale("x-keeper.sock", time.Hour)
	live := filepath.Join(dir, "x-keeper-3.sock")
	k, err := ListenKeeper(live)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	go k.Serve(t.Context())
	then := time.Now().Add(-time.Hour)
	if err := os.Chtimes(live, then, then); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "x-keeper-4.sock")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(plain, then, then); err != nil {
		t.Fatal(err)
	}

	removed, err := RemoveStaleKeepers(t.Context(), filepath.Join(dir, "x-keeper*.sock"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	if want := []string{old, legacy}; !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	for _, p := range []string{young, live, plain} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s: %v, want it kept", filepath.Base(p), err)
		}
	}
	if ok, err := Answers(t.Context(), live); err != nil || !ok {
		t.Errorf("the live keeper answers = %v, %v after the sweep; want true", ok, err)
	}
}
