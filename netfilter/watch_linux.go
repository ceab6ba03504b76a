package netfilter

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// WatchRuleset reports changes to the nf_tables ruleset as they are
// committed: it subscribes to the kernel's nf_tables notifications
// (NFNLGRP_NFTABLES, what `nft monitor` reads) and calls changed, from its
// own goroutine, once per committed transaction that touched one of
// cfg.Tables and was not made by one of this process's own tool runs.
// iptables-nft commits through nf_tables, so a rule edited, flushed or
// deleted with iptables (nft backend) or nft is seen within milliseconds;
// iptables-legacy and ipset do not use nf_tables and are not seen. When
// the kernel drops notifications (the socket's buffer overflowed), changed
// is called too: something may have been missed. It returns once
// subscribed; the watch ends with ctx.
func WatchRuleset(ctx context.Context, cfg WatchConfig, changed func()) error {
	fd, err := openWatch(cfg.NetNS)
	if err != nil {
		return fmt.Errorf("subscribing to nf_tables changes: %w", err)
	}
	w := &watch{cfg: cfg, changed: changed, fd: fd}
	stop := context.AfterFunc(ctx, func() { unix.Shutdown(fd, unix.SHUT_RD) })
	go func() {
		defer unix.Close(fd)
		defer stop()
		w.run(ctx)
	}()
	return nil
}

// openWatch opens a netfilter netlink socket subscribed to nf_tables
// notifications, in netns if set (the socket stays in the namespace it was
// made in).
func openWatch(netns string) (int, error) {
	if netns != "" {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			return -1, err
		}
		defer self.Close()
		target, err := os.Open("/run/netns/" + netns)
		if err != nil {
			return -1, err
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			return -1, fmt.Errorf("entering network namespace %s: %w", netns, err)
		}
		defer func() {
			if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
				panic(fmt.Sprintf("cannot return to this thread's network namespace: %v", err)) // the thread is locked: never reused
			}
		}()
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return -1, err
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (unix.NFNLGRP_NFTABLES - 1)}); err != nil {
		unix.Close(fd)
		return -1, err
	}
	// A large buffer: a restore of thousands of rules is one notification
	// per rule, and an overflow costs a full sync.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
	return fd, nil
}

type watch struct {
	cfg     WatchConfig
	changed func()
	fd      int
	touched bool // the transaction being read touched a watched table
}

func (w *watch) run(ctx context.Context) {
	buf := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(w.fd, buf, 0)
		if ctx.Err() != nil {
			return
		}
		switch {
		case errors.Is(err, unix.ENOBUFS): // notifications were lost
			w.touched = false
			w.changed()
			continue
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return
		case n == 0: // shut down
			return
		}
		w.messages(buf[:n])
	}
}

// messages handles a datagram of netlink messages: the messages of one
// transaction, then NFT_MSG_NEWGEN with the committing process's pid.
func (w *watch) messages(b []byte) {
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return
		}
		typ := binary.NativeEndian.Uint16(b[4:6])
		w.message(typ, b[unix.NLMSG_HDRLEN:l])
		b = b[min(nlAlign(l), len(b)):]
	}
}

func (w *watch) message(typ uint16, body []byte) {
	if typ>>8 != unix.NFNL_SUBSYS_NFTABLES || len(body) < 4 {
		return
	}
	family, attrs := body[0], body[4:]
	if typ&0xff == unix.NFT_MSG_NEWGEN {
		touched := w.touched
		w.touched = false
		if !touched {
			return
		}
		if pid, ok := attrU32(attrs, unix.NFTA_GEN_PROC_PID); ok && w.cfg.Own != nil && w.cfg.Own(pid) {
			return
		}
		w.changed()
		return
	}
	// Every other nf_tables message names its table in attribute 1
	// (NFTA_TABLE_NAME, NFTA_CHAIN_TABLE, NFTA_RULE_TABLE, NFTA_SET_TABLE,
	// NFTA_SET_ELEM_LIST_TABLE, NFTA_OBJ_TABLE, ...).
	if w.touched {
		return
	}
	name, ok := attrString(attrs, 1)
	if !ok {
		return
	}
	w.touched = w.watched(family, name)
}

func (w *watch) watched(nfproto byte, name string) bool {
	if len(w.cfg.Tables) == 0 {
		return true
	}
	for _, t := range w.cfg.Tables {
		if t.Name == name && (nfproto == unix.NFPROTO_INET || nfproto == nfprotoOf(t.Family)) {
			return true
		}
	}
	return false
}

func nfprotoOf(f Family) byte {
	if f == IPv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

func nlAlign(n int) int { return (n + 3) &^ 3 }

// nlaTypeMask strips NLA_F_NESTED and NLA_F_NET_BYTEORDER from a type.
const nlaTypeMask = 0x3fff

// attr returns the payload of the first netlink attribute of type typ.
func attr(b []byte, typ uint16) ([]byte, bool) {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		t := binary.NativeEndian.Uint16(b[2:4]) & nlaTypeMask
		if l < 4 || l > len(b) {
			return nil, false
		}
		if t == typ {
			return b[4:l], true
		}
		b = b[min(nlAlign(l), len(b)):]
	}
	return nil, false
}

func attrU32(b []byte, typ uint16) (uint32, bool) {
	v, ok := attr(b, typ)
	if !ok || len(v) < 4 {
		return 0, false
	}
	return binary.BigEndian.Uint32(v), true // nf_tables attributes are big-endian
}

func attrString(b []byte, typ uint16) (string, bool) {
	v, ok := attr(b, typ)
	if !ok {
		return "", false
	}
	return strings.TrimRight(string(v), "\x00"), true
}
