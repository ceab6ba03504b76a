package iface

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// resubscribeDelay is how long WatchLocalAddrs waits before it subscribes
// again after the kernel's notifications broke off (a full socket buffer
// drops them: ENOBUFS).
const resubscribeDelay = time.Second

// addrSocketBuffer is the receive buffer asked for the notifications'
// socket: local steering adds an address per virtual IP, thousands in a
// row, whose notifications overflow the default (net.core.rmem_default,
// 208 KiB: a few hundred of them, each charged about a kilobyte) whenever
// the reader falls behind, and each overflow leaves the set stale for
// resubscribeDelay. Past net.core.rmem_max only with CAP_NET_ADMIN in
// the initial user namespace (canForceBuffer). A variable for tests (read
// by a watch that may be subscribing again as a test ends).
var addrSocketBuffer atomic.Int64

func init() { addrSocketBuffer.Store(4 << 20) }

// canForceBuffer reports whether this process may set a socket buffer
// past net.core.rmem_max (SO_RCVBUFFORCE). Asked once, on a throwaway
// socket: github.com/vishvananda/netlink leaves the subscription's socket
// open when it cannot.
var canForceBuffer = sync.OnceValue(func() bool {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, int(addrSocketBuffer.Load())) == nil
})

// WatchLocalAddrs returns the node's addresses in network namespace ns
// (netns.None(): the caller's), read before it returns and kept current
// from rtnetlink's address notifications until ctx ends. It reports what
// goes wrong to onError (if not nil): a notification it could not read,
// and notifications that broke off (the socket's buffer overflowed), after
// which it subscribes again and reads every address anew.
func WatchLocalAddrs(ctx context.Context, ns netns.NsHandle, onError func(error)) (*LocalAddrs, error) {
	l := &LocalAddrs{}
	sub, err := subscribeAddrs(ctx, ns, onError)
	if err != nil {
		return nil, err
	}
	l.publish(sub.held)
	go func() {
		for {
			for u := range sub.updates {
				// One set a burst: local steering adds an address per
				// virtual IP, thousands in a row.
				changed := sub.apply(u)
				for more := true; more; {
					select {
					case u, ok := <-sub.updates:
						if !ok {
							more = false
							break
						}
						changed = sub.apply(u) || changed
					default:
						more = false
					}
				}
				if changed {
					l.publish(sub.held)
				}
			}
			if onError != nil && ctx.Err() == nil {
				onError(errors.New("the node's address notifications broke off (a full socket buffer drops them): reading them all again"))
			}
			sub.cancel()
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(resubscribeDelay):
				}
				if sub, err = subscribeAddrs(ctx, ns, onError); err == nil {
					l.publish(sub.held)
					break
				}
				if onError != nil && ctx.Err() == nil {
					onError(err)
				}
			}
		}
	}()
	return l, nil
}

// addrSub is one subscription to address notifications: updates closes
// when they break off or ctx ends; cancel closes its socket.
type addrSub struct {
	updates <-chan netlink.AddrUpdate
	held    map[addrOnLink]struct{} // every address, as listed after subscribing
	cancel  context.CancelFunc
}

// apply applies u to held and reports whether it changed it.
func (s *addrSub) apply(u netlink.AddrUpdate) bool {
	a, ok := netip.AddrFromSlice(u.LinkAddress.IP)
	if !ok {
		return false
	}
	k := addrOnLink{a.Unmap(), u.LinkIndex}
	if _, had := s.held[k]; had == u.NewAddr {
		return false
	}
	if u.NewAddr {
		s.held[k] = struct{}{}
	} else {
		delete(s.held, k)
	}
	return true
}

// subscribeAddrs subscribes to address notifications, then lists every
// address: a change between the two is in both, and applying the
// notifications in order over the list converges.
func subscribeAddrs(ctx context.Context, ns netns.NsHandle, onError func(error)) (addrSub, error) {
	subCtx, cancel := context.WithCancel(ctx)
	updates := make(chan netlink.AddrUpdate, 1024)
	opts := netlink.AddrSubscribeOptions{ReceiveBufferSize: int(addrSocketBuffer.Load()), ReceiveBufferForceSize: canForceBuffer(), ErrorCallback: func(err error) {
		// A failed receive ends the subscription, which WatchLocalAddrs
		// reports itself; the rest are single notifications it skipped.
		if onError != nil && subCtx.Err() == nil && !strings.HasPrefix(err.Error(), "Receive failed") {
			onError(fmt.Errorf("watching the node's addresses: %w", err))
		}
	}}
	if ns.IsOpen() {
		opts.Namespace = &ns
	}
	if err := netlink.AddrSubscribeWithOptions(updates, subCtx.Done(), opts); err != nil {
		cancel()
		return addrSub{}, fmt.Errorf("subscribing to address changes: %w", err)
	}
	held, err := listAddrs(ns)
	if err != nil {
		cancel()
		go func() { // until the closed socket ends the subscription
			for range updates {
			}
		}()
		return addrSub{}, err
	}
	return addrSub{updates: updates, held: held, cancel: cancel}, nil
}

func listAddrs(ns netns.NsHandle) (map[addrOnLink]struct{}, error) {
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening rtnetlink socket: %w", err)
	}
	defer h.Close()
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing the node's addresses: %w", err)
	}
	held := make(map[addrOnLink]struct{}, len(addrs))
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			held[addrOnLink{ip.Unmap(), a.LinkIndex}] = struct{}{}
		}
	}
	return held, nil
}
