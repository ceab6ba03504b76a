package forwarder

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/lb"
)

// TestHandedOverSocketsLeaveEpoll: once a forwarder that handed its
// listeners and UDP frontends to a successor stops accepting, its workers'
// epolls no longer watch those sockets, which the successor's duplicates
// keep open; else every connection and datagram the successor takes wakes
// a draining predecessor's worker for nothing. Read from the kernel:
// /proc/self/fdinfo of each epoll names the inode of every socket it
// watches.
func TestHandedOverSocketsLeaveEpoll(t *testing.T) {
	if testEngine == EngineGoroutines {
		t.Skip("the goroutine engine's sockets are Go's netpoller's, which takes each out itself")
	}
	leakCheck(t)
	echo := startBackend(t, "echo", modeEcho)
	uecho := startUDPEcho(t, "u")
	store := lb.NewStore(lb.StoreOptions{})
	snap, err := store.Replace([]lb.Service{service("tcp", freeFrontend(t), echo.addr), udpService("udp", freeUDPFrontend(t), uecho.addr)})
	if err != nil {
		t.Fatal(err)
	}
	f, err := New(Config{Engine: testEngine, BindFrontends: true, Mark: -1, Workers: 2, DrainTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Shutdown(context.Background())
	if err := f.Apply(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	files, err := f.Sockets() // what a successor holds
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, file := range files {
			file.Close()
		}
	}()
	if len(files) != 3 { // the TCP frontend on each worker, the UDP frontend
		t.Fatalf("handed over %d sockets, want 3: %v", len(files), files)
	}
	inodes := map[string]string{} // "ino:<hex>" as fdinfo prints it → the socket's name
	for name, file := range files {
		var st unix.Stat_t
		rc, err := file.SyscallConn() // Fd() would make the shared description blocking
		if err == nil {
			if cerr := rc.Control(func(fd uintptr) { err = unix.Fstat(int(fd), &st) }); cerr != nil {
				err = cerr
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		inodes[fmt.Sprintf("ino:%x", st.Ino)] = name
	}
	watched := func() []string {
		var names []string
		for _, w := range f.tcp.(*loopEngine).workers {
			info, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", w.ep))
			if err != nil {
				t.Fatal(err)
			}
			for _, field := range strings.Fields(string(info)) {
				if name, ok := inodes[field]; ok {
					names = append(names, name)
				}
			}
		}
		return names
	}

	// The workers register their sockets on their own goroutines.
	deadline := time.Now().Add(5 * time.Second)
	for len(watched()) < len(files) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := watched(); len(got) != len(files) {
		t.Fatalf("before: the epolls watch %v, want all %d handed-over sockets", got, len(files))
	}
	f.StopAccepting()
	if got := watched(); len(got) != 0 {
		t.Errorf("after StopAccepting the epolls still watch %v, which the successor serves", got)
	}
}
