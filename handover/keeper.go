package handover

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// deposit opens a worker's deposit of its sockets with a keeper.
const deposit = "DEPOSIT svcproxy-handover/1"

// Keeper is the master's side of master-worker mode: it holds a copy of
// the serving process's (the worker's) sockets, deposited by the worker
// whenever they change, and hands them to the next worker over the same
// exchange a predecessor uses (Take, then Ready). Because the keeper keeps
// the listening sockets open, a worker that crashes leaves connections
// waiting in their accept queues, and datagrams in their receive buffers,
// for its replacement instead of refused: HAProxy's master-worker and
// nginx's master process keep listeners the same way.
//
// Unlike a predecessor, the keeper never stops: after a worker says ready
// it answers done and keeps the sockets and the unix socket for the next.
type Keeper struct {
	path string
	ln   *net.UnixListener
	file os.FileInfo // the socket file at path, as bound here

	mu        sync.Mutex
	files     map[string]*os.File
	deposits  int
	deposited chan struct{} // closed at the first deposit
	notify    chan struct{} // a send (coalesced) after each deposit
	served    map[int]bool  // process IDs that deposited (SO_PEERCRED)
}

// ListenKeeper listens for workers at path, replacing a stale socket file.
// The socket is 0600, like a predecessor's. Each master needs a path of its
// own (see RemoveStaleKeepers): two masters on one path would leave the
// second's worker depositing with the first.
func ListenKeeper(path string) (*Keeper, error) {
	if err := supported(); err != nil {
		return nil, fmt.Errorf("keeping sockets at %s: %w", path, err)
	}
	ln, err := listenFresh(path)
	if err != nil {
		return nil, fmt.Errorf("keeping sockets at %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false) // Close removes the file only if it is still this one
	fi, err := os.Lstat(path)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("keeping sockets at %s: %w", path, err)
	}
	return &Keeper{path: path, ln: ln, file: fi, files: map[string]*os.File{},
		deposited: make(chan struct{}), notify: make(chan struct{}, 1), served: map[int]bool{}}, nil
}

// RemoveStaleKeepers removes the socket files matching pattern (a
// filepath.Glob pattern) that no keeper answers at and that were bound more
// than minAge ago: those of masters that were killed before they could
// remove their own. A keeper that answers, or a file bound within minAge
// (its master may be between bind and listen), stays. It returns the paths
// removed.
func RemoveStaleKeepers(ctx context.Context, pattern string, minAge time.Duration) ([]string, error) {
	paths, err := filepath.Glob(pattern)
	if err != nil {
		return nil, fmt.Errorf("removing stale keepers: %w", err)
	}
	var removed []string
	var errs []error
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode().Type() != os.ModeSocket || time.Since(fi.ModTime()) < minAge {
			continue
		}
		if answers, err := Answers(ctx, p); err != nil || answers {
			continue
		}
		if cur, err := os.Lstat(p); err != nil || !os.SameFile(cur, fi) {
			continue // bound again meanwhile
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing stale keeper %s: %w", p, err))
			continue
		}
		removed = append(removed, p)
	}
	return removed, errors.Join(errs...)
}

// Path is where the keeper listens.
func (k *Keeper) Path() string { return k.path }

// Held returns the names of the sockets the keeper holds and how many
// deposits it has taken.
func (k *Keeper) Held() (names []string, deposits int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for n := range k.files {
		names = append(names, n)
	}
	return names, k.deposits
}

// Deposited is closed once a worker has deposited its sockets: it served.
func (k *Keeper) Deposited() <-chan struct{} { return k.deposited }

// Deposits receives after deposits: one value for any number since the
// last receive (see Held for the count, Served for who).
func (k *Keeper) Deposits() <-chan struct{} { return k.notify }

// Served reports whether the process pid has deposited: a worker deposits
// once it serves.
func (k *Keeper) Served(pid int) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.served[pid]
}

// Forget drops what Served knows of pid, an exited worker's (its ID may
// be reused).
func (k *Keeper) Forget(pid int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.served, pid)
}

// Serve answers workers until ctx ends or Close: deposits replace the
// sockets held; a worker starting up takes them. One exchange at a time.
func (k *Keeper) Serve(ctx context.Context) error {
	go func() { <-ctx.Done(); k.ln.Close() }()
	for {
		c, err := k.ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return ctx.Err()
			}
			return fmt.Errorf("accepting a worker: %w", err)
		}
		_ = k.serveOne(c) // a worker that fails midway is its own problem
		c.Close()
	}
}

func (k *Keeper) serveOne(c *net.UnixConn) error {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	msg, _, err := recv(c, 0)
	if err != nil {
		return err
	}
	switch string(msg) {
	case deposit:
		files := map[string]*os.File{}
		if err := recvFiles(c, files); err != nil {
			for _, f := range files {
				f.Close()
			}
			return err
		}
		pid := peerPID(c)
		k.mu.Lock()
		old := k.files
		k.files = files
		k.deposits++
		if pid > 0 {
			k.served[pid] = true
		}
		if k.deposits == 1 {
			close(k.deposited)
		}
		k.mu.Unlock()
		select {
		case k.notify <- struct{}{}:
		default:
		}
		for _, f := range old {
			f.Close()
		}
		return send(c, done, nil)
	case hello:
		k.mu.Lock()
		err := sendFiles(c, k.files)
		k.mu.Unlock()
		if err != nil {
			return err
		}
		// The worker may take a while to start serving (its first sync).
		_ = c.SetDeadline(time.Now().Add(5 * time.Minute))
		if msg, _, err := recv(c, 0); err != nil || string(msg) != ready {
			return fmt.Errorf("worker did not get ready: %q, %v", msg, err)
		}
		return send(c, done, nil)
	}
	return fmt.Errorf("bad hello %q", msg)
}

// Close stops listening, removes the socket file if it is still the one
// bound here, and closes the sockets held.
func (k *Keeper) Close() error {
	err := k.ln.Close()
	if cur, serr := os.Lstat(k.path); serr == nil && os.SameFile(cur, k.file) {
		_ = os.Remove(k.path)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, f := range k.files {
		f.Close()
	}
	k.files = map[string]*os.File{}
	return err
}

// Deposit gives the keeper at path a copy of files (the caller still
// closes its own), replacing what it held.
func Deposit(ctx context.Context, path string, files map[string]*os.File) error {
	if err := supported(); err != nil {
		return fmt.Errorf("depositing sockets at %s: %w", path, err)
	}
	uc, err := dial(ctx, path)
	if errors.Is(err, ErrNoPredecessor) {
		return fmt.Errorf("depositing sockets: no keeper at %s", path)
	}
	if err != nil {
		return fmt.Errorf("depositing sockets at %s: %w", path, err)
	}
	defer uc.Close()
	if err := send(uc, deposit, nil); err != nil {
		return fmt.Errorf("depositing sockets at %s: %w", path, err)
	}
	if err := sendFiles(uc, files); err != nil {
		return fmt.Errorf("depositing sockets at %s: %w", path, err)
	}
	if msg, _, err := recv(uc, 0); err != nil || string(msg) != done {
		return fmt.Errorf("depositing sockets at %s: the keeper said %q: %v", path, msg, err)
	}
	return nil
}
