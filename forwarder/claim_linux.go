package forwarder

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/svcproxy/svcproxy/lb"
)

// claimPort binds a socket to the unspecified address and port k.
func claimPort(k claimKey) (*os.File, error) {
	typ := unix.SOCK_STREAM
	if k.proto == lb.UDP {
		typ = unix.SOCK_DGRAM
	}
	fd, err := unix.Socket(unix.AF_INET6, typ|unix.SOCK_CLOEXEC, 0)
	var sa unix.Sockaddr = &unix.SockaddrInet6{Port: int(k.port)}
	if err == nil {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0)
	} else { // no IPv6 on this node
		fd, err = unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, 0)
		sa = &unix.SockaddrInet4{Port: int(k.port)}
	}
	if err == nil && k.proto == lb.UDP {
		err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 0)
	}
	if err == nil {
		err = unix.Bind(fd, sa)
	}
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("claiming NodePort %v/%d: %w", k.proto, k.port, err)
	}
	return os.NewFile(uintptr(fd), k.socketName()), nil
}

// dupClaim duplicates a claim socket for a successor.
func dupClaim(k claimKey, c *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(c.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	return os.NewFile(uintptr(fd), k.socketName()), err
}
