package forwarder

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/lb"
)

// TestOutOfDescriptors: with the process out of file descriptors,
// connections already open keep flowing, and a client that connects
// meanwhile is
//   - refused at once (a reset, counted as connections_total{result=
//     "fd_limit"}) while the spare descriptor is held: it can try elsewhere
//     rather than wait in the accept queue;
//   - held in the queue and served once descriptors are free, with accept
//     backing off (counted) instead of spinning, when the spare is lost too;
//   - reset without holding it against the backend when accept found a
//     descriptor but the backend socket did not (a local error).
func TestOutOfDescriptors(t *testing.T) {
	for _, tc := range []struct {
		name string
		// free is how many descriptors are left free; dropSpare gives up the
		// spare descriptor first.
		free      int
		dropSpare bool
		want      string // "reset" or "served"
	}{
		{name: "spare refuses queued clients", want: "reset"},
		{name: "no spare: backs off, serves later", dropSpare: true, want: "served"},
		// Without the spare: accept may look for a second client, fail
		// for lack of a descriptor and free the spare to refuse it, and
		// the backend socket would take the spare's.
		{name: "backend socket fails: local error", free: 1, dropSpare: true, want: "reset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outOfDescriptors(t, tc.free, tc.dropSpare, tc.want)
		})
	}
}

func outOfDescriptors(t *testing.T, free int, dropSpare bool, want string) {
	leakCheck(t)
	fe := freeFrontend(t)
	be := startBackend(t, "echo", modeEcho)
	// One worker: with more, one worker's accept can take the descriptor
	// another frees by closing the spare, and serve (dial, fail, reset)
	// the client that would have been refused: the client is reset all
	// the same, but counted as a local dial error.
	h := newHarness(t, Config{Workers: 1}, service("echo", fe, be.addr))
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
	backend := h.fwd.snap.Load().Route(lb.TCP, fe).Backends()[0]

	if dropSpare { // lost, and it cannot be reopened while the descriptors are taken
		spare.Lock()
		unix.Close(spare.fd)
		spare.fd = -1
		spare.Unlock()
		defer holdSpare()
	}

	// Client sockets made while descriptors are free, connected once they
	// are not (connect needs none): their connections queue at the proxy.
	clients := 3
	if free > 0 {
		clients = 1
	}
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
	// The limit caps descriptor numbers, not their count: above the
	// highest open one, so that closing any of them (the spare above all)
	// makes room.
	low := lim
	low.Cur = uint64(highestFD(t) + 16)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Skipf("cannot lower the descriptor limit: %v", err)
	}
	// Take every descriptor left, so there is no room at all, then give
	// back free of them.
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
	for range free {
		unix.Close(fillers[len(fillers)-1])
		fillers = fillers[:len(fillers)-1]
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
	start := time.Now()
	for _, fd := range fds {
		if err := unix.Connect(fd, sa); err != nil {
			restore()
			t.Fatalf("connecting: %v", err)
		}
		// Non-blocking, so the file's deadlines hold: a client the proxy
		// neither resets nor serves fails the test instead of hanging it.
		if err := unix.SetNonblock(fd, true); err != nil {
			restore()
			t.Fatal(err)
		}
	}
	conns := make([]net.Conn, len(fds))
	for i, fd := range fds {
		file := os.NewFile(uintptr(fd), "client") // no new descriptor: the client keeps fd
		conns[i] = &fileConn{f: file}
	}

	switch want {
	case "reset":
		for i, c := range conns {
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, err := c.Read(make([]byte, 1))
			if !errors.Is(err, syscall.ECONNRESET) {
				restore()
				t.Fatalf("queued client %d: read %v, want a reset (fd_limit %v, dial errors %v)", i, err,
					testutil.ToFloat64(h.m.connFDLimit), testutil.ToFloat64(h.m.dialError))
			}
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("clients were reset after %v, want at once", d)
		}
		echo("while out of descriptors")
		restore()
		if free == 0 {
			if got := testutil.ToFloat64(h.m.connFDLimit); got != float64(clients) {
				t.Errorf("connections_total{result=fd_limit} = %v, want %d", got, clients)
			}
		} else if got := testutil.ToFloat64(h.m.dialError); got != 1 {
			t.Errorf("dial_attempts_total{result=error} = %v, want 1", got)
		}
		if n := backend.Failures(); n != 0 {
			t.Errorf("the backend has %d failures: the host's own shortage was held against it", n)
		}
	case "served":
		waitFor(t, "accept failing for lack of descriptors", func() bool { return testutil.ToFloat64(h.m.acceptFDLimit) > 0 })
		echo("while out of descriptors")
		time.Sleep(50 * time.Millisecond)
		failures := testutil.ToFloat64(h.m.acceptFDLimit)
		restore()
		if failures > 100 {
			t.Errorf("accept failed %v times in 50ms: it spins instead of backing off", failures)
		}
		for i, c := range conns {
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.WriteString(c, "queued\n"); err != nil {
				t.Fatalf("queued client %d: %v (dial failures %v, dial errors %v, no service %v)", i, err,
					testutil.ToFloat64(h.m.connDialFailed), testutil.ToFloat64(h.m.dialError), testutil.ToFloat64(h.m.connNoService))
			}
			if got, err := bufio.NewReader(c).ReadString('\n'); err != nil || got != "queued\n" {
				t.Fatalf("queued client %d: echoed %q, %v", i, got, err)
			}
		}
	}
	for _, c := range conns {
		c.Close()
	}
	echo("after")
	if dropSpare {
		return
	}
	spare.Lock()
	held := spare.fd >= 0
	spare.Unlock()
	if !held {
		t.Error("the spare descriptor was not taken back")
	}
}

// highestFD is the highest descriptor number open.
func highestFD(t *testing.T) int {
	high := -1
	for fd := range fdTargets(t) {
		if n, err := strconv.Atoi(fd); err == nil && n > high {
			high = n
		}
	}
	return high
}

// fileConn reads and writes a client socket through its *os.File, which
// (unlike net.FileConn) needs no second descriptor: the test runs with
// none to spare.
type fileConn struct {
	net.Conn
	f *os.File
}

func (c *fileConn) Read(b []byte) (int, error)    { return c.f.Read(b) }
func (c *fileConn) Write(b []byte) (int, error)   { return c.f.Write(b) }
func (c *fileConn) Close() error                  { return c.f.Close() }
func (c *fileConn) SetDeadline(t time.Time) error { return c.f.SetDeadline(t) }
