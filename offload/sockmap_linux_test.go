package offload

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// newSockmap returns a Sockmap closed at the test's end, or skips the test
// where sockmaps cannot run.
func newSockmap(t *testing.T) *Sockmap {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_BPF, CAP_NET_ADMIN) to load the sockmap program")
	}
	s, err := New(Config{MaxPairs: 1024})
	if errors.Is(err, ErrUnsupported) {
		t.Skipf("the kernel takes no sockmap offload: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// splice is a relay without user space: client ⇄ (a, b) ⇄ server, where a
// and b are the two "proxy" sockets put into the sockmap.
type splice struct {
	client, server net.Conn // the ends
	a, b           *net.TCPConn
}

func tcpPair(t *testing.T) (near, far *net.TCPConn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

func rawFD(t *testing.T, c *net.TCPConn) int {
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd int
	rc.Control(func(f uintptr) { fd = int(f) })
	return fd
}

func TestPrivilegedRedirect(t *testing.T) {
	s := newSockmap(t)
	client, a := tcpPair(t)
	b, server := tcpPair(t)
	// A request queued before insertion stays for user space.
	client.Write([]byte("early"))
	time.Sleep(10 * time.Millisecond)
	p, err := s.Insert(rawFD(t, a), rawFD(t, b))
	if err != nil {
		t.Fatal(err)
	}
	early := make([]byte, 5)
	server.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(server, early); err != nil || string(early) != "early" {
		t.Fatalf("bytes queued before insertion: got %q, %v", early, err)
	}
	msg := bytes.Repeat([]byte("x"), 1<<20)
	go client.Write(msg)
	got := make([]byte, len(msg))
	server.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(server, got); err != nil {
		t.Fatalf("server read: %v", err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("server got other bytes: starts %q", got[:8])
	}
	server.Write([]byte("reply"))
	buf := make([]byte, 5)
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(client, buf); err != nil || string(buf) != "reply" {
		t.Fatalf("client read %q, %v", buf, err)
	}
	a.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	n, err := a.Read(buf)
	t.Logf("user-space read of a after insertion: %q %v", buf[:n], err)
	c, err := s.Bytes(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.In != uint64(len(msg)+5) || c.Out != 5 {
		t.Errorf("counts: got %+v, want In %d Out 5", c, len(msg)+5)
	}
	w, err := Written(rawFD(t, b))
	t.Logf("written into b: %d %v", w, err)
	// FIN from the client: user space sees EOF on a.
	client.CloseWrite()
	a.SetReadDeadline(time.Now().Add(time.Second))
	n, err = a.Read(buf)
	t.Logf("after client FIN, a read: %d %v", n, err)
	if err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("want EOF on a, got %d %v", n, err)
	}
	// The FIN must not break the other direction (a bare FIN's skb,
	// redirected, would set EPIPE on b).
	if _, err := server.Write([]byte("after")); err != nil {
		t.Fatal(err)
	}
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(client, buf); err != nil || string(buf) != "after" {
		t.Fatalf("after the client's FIN, client read %q, %v", buf, err)
	}
	if _, err := b.Write([]byte("still")); err != nil {
		t.Fatalf("b after the client's FIN: %v", err)
	}
	s.Remove(p)
	if _, err := s.Bytes(p); err == nil {
		t.Error("counts still there after Remove")
	}
}

// bpfFDs counts this process's open BPF map and program descriptors.
func bpfFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(target, "anon_inode:bpf-") {
			n++
		}
	}
	return n
}

// TestPrivilegedCloseFrees: Close leaves no map or program open, and a
// pair's sockets keep working (on their own queues) once it is gone.
func TestPrivilegedCloseFrees(t *testing.T) {
	before := bpfFDs(t)
	s := newSockmap(t)
	if n := bpfFDs(t); n <= before {
		t.Fatalf("no BPF descriptors open after New (%d, %d before)", n, before)
	}
	client, a := tcpPair(t)
	b, server := tcpPair(t)
	if _, err := s.Insert(rawFD(t, a), rawFD(t, b)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := bpfFDs(t); n != before {
		t.Errorf("BPF descriptors open after Close: %d, want %d", n, before)
	}
	// The maps are freed once no socket holds them: the sockets are plain
	// again, and what client sends waits on a for user space.
	client.Write([]byte("plain"))
	buf := make([]byte, 5)
	a.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(a, buf); err != nil || string(buf) != "plain" {
		t.Fatalf("a after Close: read %q, %v", buf, err)
	}
	_ = server
}
