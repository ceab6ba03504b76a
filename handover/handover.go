// Package handover owns passing svcproxy's sockets from a running process
// to its successor over a unix socket (SCM_RIGHTS), so a restart or an
// upgrade drops no connection and refuses none.
//
// The running process (the predecessor) listens on a unix socket. A new
// process (the successor) connects and says hello; the predecessor sends the
// names of its sockets and then the sockets themselves. The successor starts
// serving on them — they are the very same kernel sockets, so connections
// waiting in their accept queues are not lost — and says ready. The
// predecessor then stops accepting, closes its listener on the unix socket
// and says done; it drains its open connections and exits, leaving its
// steering rules in place for the successor. The successor then listens on
// the unix socket itself, for the next restart.
//
// The unix socket lives on the node (a hostPath such as /run/svcproxy), so
// the same exchange serves a binary replaced on disk (SIGUSR2: the process
// starts its successor itself) and a DaemonSet rolling update (the new pod
// finds the old one's socket).
//
// It is Linux-only (SOCK_SEQPACKET, SCM_RIGHTS): on other systems Take and
// Listen fail with errors.ErrUnsupported.
package handover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync/atomic"
	"syscall"
	"time"
)

// ErrNoPredecessor means no running process answered at the path.
var ErrNoPredecessor = errors.New("no svcproxy to take over from")

const (
	hello = "HELLO svcproxy-handover/1"
	ready = "READY"
	done  = "DONE"

	// maxFDs per message, under the kernel's SCM_MAX_FD (253).
	maxFDs = 200
)

// header precedes the file descriptors.
type header struct {
	Names []string `json:"names"`
}

// Take connects to the predecessor at path and receives its sockets by
// name. It returns ErrNoPredecessor when nothing listens there. The caller
// owns the files; it must call Ready once it serves on them.
func Take(ctx context.Context, path string) (*Handover, error) {
	if err := supported(); err != nil {
		return nil, fmt.Errorf("taking over from %s: %w", path, err)
	}
	uc, err := dial(ctx, path)
	if errors.Is(err, ErrNoPredecessor) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("connecting to predecessor at %s: %w", path, err)
	}
	h := &Handover{conn: uc, Files: map[string]*os.File{}}
	if err := h.take(); err != nil {
		uc.Close()
		for _, f := range h.Files {
			f.Close()
		}
		return nil, fmt.Errorf("taking over from %s: %w", path, err)
	}
	_ = uc.SetDeadline(time.Time{})
	return h, nil
}

// dial connects to the unix socket at path, with ctx's deadline on the
// connection; nothing listening there (no file, or a stale one) is
// ErrNoPredecessor.
func dial(ctx context.Context, path string) (*net.UnixConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, ErrNoPredecessor
		}
		return nil, err
	}
	uc := c.(*net.UnixConn)
	if dl, ok := ctx.Deadline(); ok {
		_ = uc.SetDeadline(dl)
	}
	return uc, nil
}

// listenFresh listens on a private unix socket at path (listenPrivate),
// replacing a stale socket file.
func listenFresh(path string) (*net.UnixListener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing stale socket %s: %w", path, err)
	}
	return listenPrivate(path)
}

// Answers reports whether a running svcproxy listens at path: a connect
// succeeds (or finds its queue full). Nothing at path, or a stale socket
// file nobody listens on, is false with no error; a connect that fails
// otherwise is that error. The connection is closed at once, before any
// hello: the listener drops it and keeps waiting for a successor.
func Answers(ctx context.Context, path string) (bool, error) {
	if err := supported(); err != nil {
		return false, fmt.Errorf("probing %s: %w", path, err)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unixpacket", path)
	switch {
	case err == nil:
		c.Close()
		return true, nil
	case errors.Is(err, syscall.EAGAIN):
		return true, nil // a full accept queue: listening, and busy
	case errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED):
		return false, nil
	}
	return false, fmt.Errorf("probing %s: %w", path, err)
}

// Handover is a successor's side of one exchange.
type Handover struct {
	Files map[string]*os.File // the predecessor's sockets by name

	conn *net.UnixConn
}

func (h *Handover) take() error {
	if err := send(h.conn, hello, nil); err != nil {
		return err
	}
	return recvFiles(h.conn, h.Files)
}

// recvFiles reads a header of names and then their sockets into files.
func recvFiles(c *net.UnixConn, files map[string]*os.File) error {
	msg, _, err := recv(c, 0)
	if err != nil {
		return fmt.Errorf("reading header: %w", err)
	}
	var hdr header
	if err := json.Unmarshal(msg, &hdr); err != nil {
		return fmt.Errorf("decoding header: %w", err)
	}
	for start := 0; start < len(hdr.Names); start += maxFDs {
		names := hdr.Names[start:min(start+maxFDs, len(hdr.Names))]
		_, fds, err := recv(c, len(names))
		if err != nil {
			return err
		}
		for i, fd := range fds {
			files[names[i]] = os.NewFile(uintptr(fd), names[i])
		}
	}
	return nil
}

// sendFiles writes a header of files' names and then the sockets, at most
// maxFDs a message.
func sendFiles(c *net.UnixConn, files map[string]*os.File) error {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	hdr, _ := json.Marshal(header{Names: names})
	if err := send(c, string(hdr), nil); err != nil {
		return err
	}
	for start := 0; start < len(names); start += maxFDs {
		batch := names[start:min(start+maxFDs, len(names))]
		fds := make([]int, len(batch))
		for i, n := range batch {
			fd, err := rawFD(files[n])
			if err != nil {
				return fmt.Errorf("sending %s: %w", n, err)
			}
			fds[i] = fd
		}
		if err := send(c, "fds", fds); err != nil {
			return err
		}
	}
	return nil
}

// rawFD is f's descriptor, which stays valid while f is open. Not f.Fd():
// that makes the file description blocking, and it is shared with the
// sockets this process still serves on (f is a duplicate): until the
// successor made it non-blocking again, an accept here that found the queue
// empty would block in the system call instead of saying EAGAIN, and then
// take, and drop at its close, a connection meant for the successor.
func rawFD(f *os.File) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	if err := rc.Control(func(s uintptr) { fd = int(s) }); err != nil {
		return -1, err
	}
	return fd, nil
}

// Ready tells the predecessor the successor is serving, and waits until the
// predecessor has stopped accepting and let go of the unix socket.
func (h *Handover) Ready(ctx context.Context) error {
	defer h.conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = h.conn.SetDeadline(dl)
	}
	if err := send(h.conn, ready, nil); err != nil {
		return fmt.Errorf("telling predecessor we are ready: %w", err)
	}
	msg, _, err := recv(h.conn, 0)
	if err != nil || string(msg) != done {
		return fmt.Errorf("waiting for predecessor to let go: %q, %v", msg, err)
	}
	return nil
}

// Abandon gives up the takeover without serving (a successor that fails
// after taking the sockets): the predecessor keeps serving, and repairs
// whatever this process wrote meanwhile. Exiting does the same.
func (h *Handover) Abandon() { h.conn.Close() }

// Server is a predecessor's side: it offers its sockets to one successor.
type Server struct {
	path string
	ln   *net.UnixListener
	file os.FileInfo // the socket file at path, as bound here

	// handedOver is set once a successor has taken over: the socket
	// file at path is then the successor's, and Close must leave it.
	handedOver atomic.Bool
	// handing is set while a successor holds the sockets and has not
	// said it serves (Handing).
	handing atomic.Bool
}

// Handing reports whether a successor has the sockets and is making its
// first sync, writing its rules: rules that change meanwhile are the
// successor's, not tampering to repair.
func (s *Server) Handing() bool { return s.handing.Load() }

// Listen listens for a successor at path, replacing a stale socket file.
// The socket is 0600: only root (the successor) may take the sockets.
func Listen(path string) (*Server, error) {
	if err := supported(); err != nil {
		return nil, fmt.Errorf("listening for a successor at %s: %w", path, err)
	}
	ln, err := listenFresh(path)
	if err != nil {
		return nil, fmt.Errorf("listening for a successor at %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false) // the successor binds the same path next
	fi, err := os.Lstat(path)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("listening for a successor at %s: %w", path, err)
	}
	return &Server{path: path, ln: ln, file: fi}, nil
}

// removeOwn removes the socket file at path if it is still the one bound
// here: a successor that gave up waiting for this process may have bound
// its own there, which must stay reachable for the next restart.
func (s *Server) removeOwn() {
	if cur, err := os.Lstat(s.path); err == nil && os.SameFile(cur, s.file) {
		_ = os.Remove(s.path)
	}
}

// Close stops listening and removes the socket file, unless a successor
// has taken over: by then the path may already be the successor's own
// listener, and removing it would leave the successor unreachable for the
// next restart (and this process, if it were still listening, orphaned).
func (s *Server) Close() error {
	err := s.ln.Close()
	if !s.handedOver.Load() {
		s.removeOwn()
	}
	return err
}

// Serve waits for a successor, sends it the sockets sockets returns, and
// when it says ready, calls stop (which must stop accepting on them), stops
// listening and tells the successor. It returns nil once a successor has
// taken over, or ctx's error. A successor that fails midway is dropped and
// the next one is waited for; the predecessor keeps serving meanwhile.
func (s *Server) Serve(ctx context.Context, sockets func() (map[string]*os.File, error), stop func()) error {
	go func() { <-ctx.Done(); s.ln.Close() }()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("accepting a successor: %w", err)
		}
		ok, err := s.serveOne(c, sockets, stop)
		c.Close()
		if ok {
			return nil
		}
		_ = err // a failed successor is its own problem; keep serving
	}
}

func (s *Server) serveOne(c *net.UnixConn, sockets func() (map[string]*os.File, error), stop func()) (bool, error) {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	msg, _, err := recv(c, 0)
	if err != nil || string(msg) != hello {
		return false, fmt.Errorf("bad hello %q: %v", msg, err)
	}
	files, err := sockets()
	if err != nil {
		return false, err
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if err := sendFiles(c, files); err != nil {
		return false, err
	}
	s.handing.Store(true)
	defer s.handing.Store(false)
	// The successor may take a while to start serving (its first sync).
	_ = c.SetDeadline(time.Now().Add(5 * time.Minute))
	msg, _, err = recv(c, 0)
	if err != nil || string(msg) != ready {
		return false, fmt.Errorf("successor did not get ready: %q, %v", msg, err)
	}
	stop()
	// Let go of the path before saying done: the successor binds it next,
	// and nothing of ours may touch it after that.
	s.handedOver.Store(true)
	s.ln.Close()
	s.removeOwn()
	return true, send(c, done, nil)
}
