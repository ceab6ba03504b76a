//go:build linux

package handover

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestHandover(t *testing.T) {
	path := filepath.Join(t.TempDir(), "handover.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// The predecessor's sockets: a TCP listener with a connection waiting
	// in its accept queue, and a UDP socket.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	waiting, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer waiting.Close()

	srv, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("handover socket mode = %v, %v; want 0600", fi.Mode().Perm(), err)
	}
	stopped := make(chan struct{})
	served := make(chan error, 1)
	go func() {
		served <- srv.Serve(ctx, func() (map[string]*os.File, error) {
			lf, err := ln.(*net.TCPListener).File()
			if err != nil {
				return nil, err
			}
			uf, err := pc.(*net.UDPConn).File()
			if err != nil {
				return nil, err
			}
			return map[string]*os.File{"tcp/a": lf, "udp/b": uf}, nil
		}, func() { ln.Close(); close(stopped) })
	}()

	if srv.Handing() {
		t.Error("Handing before any successor came")
	}
	h, err := Take(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Files) != 2 || h.Files["tcp/a"] == nil || h.Files["udp/b"] == nil {
		t.Fatalf("took %v, want tcp/a and udp/b", h.Files)
	}
	// The successor has the sockets and makes its first sync.
	waitHanding(t, srv, true)
	// The successor serves on the very same socket: the waiting
	// connection is accepted here, after the predecessor let go.
	ln2, err := net.FileListener(h.Files["tcp/a"])
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	if err := h.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	<-stopped
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if srv.Handing() {
		t.Error("Handing after the successor took over")
	}
	c, err := ln2.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go io.WriteString(waiting, "hi")
	buf := make([]byte, 2)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hi" {
		t.Fatalf("the connection queued before the handover: %q, %v", buf, err)
	}

	// The successor can now listen at the path for the next restart.
	srv2, err := Listen(path)
	if err != nil {
		t.Fatalf("successor listening at the path: %v", err)
	}
	srv2.Close()
}

func TestTakeWithNoPredecessor(t *testing.T) {
	_, err := Take(context.Background(), filepath.Join(t.TempDir(), "none.sock"))
	if !errors.Is(err, ErrNoPredecessor) {
		t.Fatalf("err = %v, want ErrNoPredecessor", err)
	}
	// A stale socket file nobody listens on is no predecessor either.
	path := filepath.Join(t.TempDir(), "stale.sock")
	srv, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv.ln.Close() // leaves the file, as a crashed process would
	if _, err := Take(context.Background(), path); !errors.Is(err, ErrNoPredecessor) {
		t.Fatalf("stale socket: err = %v, want ErrNoPredecessor", err)
	}
}

func TestFailedSuccessorDoesNotStopPredecessor(t *testing.T) {
	path := filepath.Join(t.TempDir(), "handover.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	served := make(chan error, 1)
	go func() {
		served <- srv.Serve(ctx, func() (map[string]*os.File, error) { return map[string]*os.File{}, nil }, func() { stopped = true })
	}()
	// A successor that takes the sockets and dies before ready.
	h, err := Take(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	waitHanding(t, srv, true)
	h.Abandon()
	waitHanding(t, srv, false) // this process's rules again
	// The next one succeeds.
	h, err = Take(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil || !stopped {
		t.Fatalf("Serve = %v, stopped = %v", err, stopped)
	}
}

// TestChainOfRestarts is three processes in a row, with the predecessor's
// Close landing after its successor already listens at the path (as a
// deferred Close does under load): the third must still find the second.
func TestChainOfRestarts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "handover.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	none := func() (map[string]*os.File, error) { return map[string]*os.File{}, nil }

	first, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- first.Serve(ctx, none, func() {}) }()

	h, err := Take(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatalf("first Serve: %v", err)
	}
	second, err := Listen(path) // the successor, now listening for the next
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	first.Close() // late: must not take the path from the second

	go func() { served <- second.Serve(ctx, none, func() {}) }()
	h, err = Take(ctx, path)
	if err != nil {
		t.Fatalf("the third process cannot reach the second: %v", err)
	}
	if err := h.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatalf("second Serve: %v", err)
	}
}

// TestAnswers: a serving predecessor answers a probe and, probed, still
// hands over to the next successor; no socket file, a stale one or a plain
// file (ECONNREFUSED too) does not answer.
func TestAnswers(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	stale := filepath.Join(dir, "stale.sock")
	srv, err := Listen(stale)
	if err != nil {
		t.Fatal(err)
	}
	srv.ln.Close() // leaves the file, as a crashed process would
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(dir, "none.sock"), stale, plain} {
		if ok, err := Answers(ctx, path); ok || err != nil {
			t.Errorf("Answers(%s) = %v, %v; want false, nil", filepath.Base(path), ok, err)
		}
	}

	path := filepath.Join(dir, "handover.sock")
	if srv, err = Listen(path); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() {
		served <- srv.Serve(ctx, func() (map[string]*os.File, error) { return map[string]*os.File{}, nil }, func() {})
	}()
	for i := 0; i < 3; i++ {
		if ok, err := Answers(ctx, path); !ok || err != nil {
			t.Fatalf("Answers(a serving predecessor) = %v, %v; want true, nil", ok, err)
		}
	}
	h, err := Take(ctx, path)
	if err != nil {
		t.Fatalf("Take after probes: %v", err)
	}
	if err := h.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve = %v", err)
	}
}

// TestCloseLeavesAnotherSocketFile: a successor that gave up waiting for
// its predecessor binds the path anew; the predecessor closing later must
// not remove that successor's socket file (its own successor would find
// no one), only its own.
func TestCloseLeavesAnotherSocketFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "handover.sock")
	old, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	succ, err := Listen(path) // replaces the file
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	if ok, err := Answers(context.Background(), path); !ok || err != nil {
		t.Errorf("after the predecessor closed, the successor's socket answers %v, %v; want true", ok, err)
	}
	if err := succ.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after the successor closed, its socket file: %v; want it removed", err)
	}
}

// TestHandoverLeavesSocketsNonBlocking: sending the sockets leaves them as
// non-blocking as they were. They share their file description with the
// ones the predecessor still accepts on; had the send made it blocking,
// the predecessor's next accept on an empty queue would block in the
// system call and then take a connection meant for the successor.
func TestHandoverLeavesSocketsNonBlocking(t *testing.T) {
	path := filepath.Join(t.TempDir(), "handover.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	nonblocking := func() bool {
		t.Helper()
		rc, err := ln.(*net.TCPListener).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var flags int
		var ferr error
		if err := rc.Control(func(fd uintptr) { flags, ferr = unix.FcntlInt(fd, unix.F_GETFL, 0) }); err != nil || ferr != nil {
			t.Fatal(err, ferr)
		}
		return flags&unix.O_NONBLOCK != 0
	}
	if !nonblocking() {
		t.Fatal("a Go listener is blocking to begin with")
	}
	srv, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() {
		served <- srv.Serve(ctx, func() (map[string]*os.File, error) {
			f, err := ln.(*net.TCPListener).File()
			return map[string]*os.File{"tcp/a": f}, err
		}, func() {})
	}()
	h, err := Take(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if !nonblocking() {
		t.Error("the predecessor's listener is blocking after sending it")
	}
	for _, f := range h.Files {
		f.Close()
	}
	if err := h.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

// waitHanding waits up to 5s for srv.Handing to be want.
func waitHanding(t *testing.T, srv *Server, want bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); srv.Handing() != want; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Handing = %v, want %v", !want, want)
		}
	}
}
