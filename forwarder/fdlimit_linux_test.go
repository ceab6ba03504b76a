package forwarder

import (
	"bufio"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
)

// TestOutOfDescriptors: with the process out of file descriptors, accept
// backs off (counted) instead of spinning, connections already open keep
// flowing, and the clients that queued meanwhile are served once
// descriptors are free again.
func TestOutOfDescriptors(t *testing.T) {
	leakCheck(t)
	fe := freeFrontend(t)
	be := startBackend(t, "echo", modeEcho)
	h := newHarness(t, Config{}, service("echo", fe, be.addr))
	open := dial(t, fe)
	defer open.Close()
	r := bufio.NewReader(open)
	echo := func(what string) {
		t.Helper()
		_ = open.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(open, what+"\n"); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got, err := r.ReadString('\n'); err != nil || got != what+"\n" {
			t.Fatalf("%s: echoed %q, %v", what, got, err)
		}
	}
	echo("before")

	// Client sockets made while descriptors are free, connected once they
	// are not (connect needs none): their connections queue at the proxy.
	const clients = 3
	var fds []int
	for range clients {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		fds = append(fds, fd)
	}
	var lim unix.Rlimit // the limit is per process: the tests' sockets count too
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	closeIdlePipes(t) // descriptors accept would shed and retry with
	low := lim
	low.Cur = uint64(openFDs(t) + 64)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Skipf("cannot lower the descriptor limit: %v", err)
	}
	// Take every descriptor left, so there is no room at all.
	var fillers []int
	defer func() {
		for _, fd := range fillers {
			unix.Close(fd)
		}
	}()
	for {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
		if err != nil {
			break
		}
		fillers = append(fillers, fd)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer restore()
	sa := &unix.SockaddrInet4{Port: int(fe.Port()), Addr: fe.Addr().As4()}
	for _, fd := range fds {
		if err := unix.Connect(fd, sa); err != nil {
			restore()
			t.Fatalf("connecting: %v", err)
		}
	}
	waitFor(t, "accept failing for lack of descriptors", func() bool { return testutil.ToFloat64(h.m.acceptFDLimit) > 0 })
	echo("while out of descriptors")
	time.Sleep(50 * time.Millisecond)
	failures := testutil.ToFloat64(h.m.acceptFDLimit)
	restore()
	if failures > 100 {
		t.Errorf("accept failed %v times in 50ms: it spins instead of backing off", failures)
	}
	echo("after")
	for i, fd := range fds {
		file := os.NewFile(uintptr(fd), "client")
		c, err := net.FileConn(file)
		file.Close()
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "queued\n"); err != nil {
			t.Fatalf("queued client %d: %v (dial failures %v, dial errors %v, no service %v)", i, err,
				testutil.ToFloat64(h.m.connDialFailed), testutil.ToFloat64(h.m.dialError), testutil.ToFloat64(h.m.connNoService))
		}
		if got, err := bufio.NewReader(c).ReadString('\n'); err != nil || got != "queued\n" {
			t.Fatalf("queued client %d: echoed %q, %v", i, got, err)
		}
		c.Close()
	}
}
