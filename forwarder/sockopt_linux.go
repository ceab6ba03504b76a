package forwarder

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// listenControl is a ListenConfig.Control that sets SO_REUSEPORT, so several
// sockets (one per worker) share a port and the kernel spreads connections
// over them.
func listenControl(network, address string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("setting SO_REUSEPORT on %s: %w", address, err)
	}
	return nil
}

// defaultMark is the Mark of a Config that sets none.
const defaultMark = DefaultMark

// checkPlatform: Linux has every feature Config can ask for.
func (c *Config) checkPlatform() error { return nil }

// listenSockets is how many sockets listen on each address: one per
// worker, sharing it through SO_REUSEPORT.
func listenSockets(workers int) int { return workers }

// markControl returns a Dialer.Control that sets SO_MARK to mark.
func markControl(mark int) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, mark)
		})
		if err == nil {
			err = serr
		}
		if err != nil {
			return fmt.Errorf("setting SO_MARK %#x on socket to %s: %w", mark, address, err)
		}
		return nil
	}
}

// originalDst returns the destination a connection had before iptables
// REDIRECT (or DNAT) rewrote it, from conntrack.
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var dst netip.AddrPort
	var serr error
	err = rc.Control(func(fd uintptr) { dst, serr = getOriginalDst(int(fd)) })
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("reading SO_ORIGINAL_DST: %w", err)
	}
	return dst, nil
}

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST from linux/netfilter_ipv6/ip6_tables.h.
const ip6tSOOriginalDst = 80

func getOriginalDst(fd int) (netip.AddrPort, error) {
	// Try IPv4 first; an IPv6 socket answers ENOENT or EINVAL there.
	var sa4 unix.RawSockaddrInet4
	l := uint32(unsafe.Sizeof(sa4))
	if err := getsockopt(fd, unix.SOL_IP, unix.SO_ORIGINAL_DST, unsafe.Pointer(&sa4), &l); err == nil {
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa4.Port))[:])
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), port), nil
	}
	var sa6 unix.RawSockaddrInet6
	l = uint32(unsafe.Sizeof(sa6))
	if err := getsockopt(fd, unix.SOL_IPV6, ip6tSOOriginalDst, unsafe.Pointer(&sa6), &l); err != nil {
		return netip.AddrPort{}, err
	}
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa6.Port))[:])
	return netip.AddrPortFrom(netip.AddrFrom16(sa6.Addr).Unmap(), port), nil
}

func getsockopt(fd, level, name int, v unsafe.Pointer, l *uint32) error {
	_, _, errno := unix.RawSyscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(name), uintptr(v), uintptr(unsafe.Pointer(l)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}
