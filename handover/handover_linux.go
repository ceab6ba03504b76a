package handover

import (
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// supported: Linux has SOCK_SEQPACKET unix sockets and SCM_RIGHTS.
func supported() error { return nil }

// listenPrivate listens on a unix socket at path that only its owner may
// connect to (0600).
func listenPrivate(path string) (*net.UnixListener, error) {
	old := unix.Umask(0o177)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	unix.Umask(old)
	return ln, err
}

// send writes one message (SOCK_SEQPACKET keeps messages whole), with fds
// attached when given.
func send(c *net.UnixConn, msg string, fds []int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix([]byte(msg), oob, nil); err != nil {
		return fmt.Errorf("sending %q with %d sockets: %w", msg, len(fds), err)
	}
	return nil
}

// recv reads one message and exactly nfds attached file descriptors.
func recv(c *net.UnixConn, nfds int) ([]byte, []int, error) {
	buf := make([]byte, 1<<20)
	oob := make([]byte, unix.CmsgSpace(max(nfds, 1)*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, nil, fmt.Errorf("receiving: %w", err)
	}
	var fds []int
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, nil, fmt.Errorf("parsing socket control message: %w", err)
		}
		for _, m := range msgs {
			got, err := unix.ParseUnixRights(&m)
			if err != nil {
				return nil, nil, err
			}
			fds = append(fds, got...)
		}
	}
	if len(fds) != nfds || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, nil, fmt.Errorf("received %d sockets (flags %#x), want %d", len(fds), flags, nfds)
	}
	if n == 0 {
		return nil, nil, errors.New("connection closed")
	}
	return buf[:n], fds, nil
}

// peerPID is the process ID of c's peer (SO_PEERCRED), 0 when unknown.
func peerPID(c *net.UnixConn) int {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	pid := 0
	_ = raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = int(cred.Pid)
		}
	})
	return pid
}
