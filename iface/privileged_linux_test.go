package iface_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/svcproxy/svcproxy/iface"
	"github.com/svcproxy/svcproxy/internal/kerneltest"
)

var gate = kerneltest.Gate{Package: "./iface/", Prefix: "svcproxy-if-", Tools: []string{"ip"}}

// inNS opens a Netlink in a fresh namespace.
func inNS(t *testing.T) (*iface.Netlink, string) {
	t.Helper()
	gate.Require(t)
	ns := gate.NewNS(t)
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	l, err := iface.New(h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l, ns
}

// TestPrivilegedVirtualIPs: the dummy interface (an empty bridge where the
// kernel has no dummy driver) takes host addresses of both families that
// can be listened on at once, left down; adding twice and removing what is
// not there are no-ops; deleting it takes its addresses.
func TestPrivilegedVirtualIPs(t *testing.T) {
	ctx := context.Background()
	l, ns := inNS(t)
	const dev = "svcproxy-t0"
	if _, err := l.Addrs(ctx, dev); !errors.Is(err, iface.ErrNoLink) {
		t.Fatalf("Addrs of a missing interface: %v, want ErrNoLink", err)
	}
	for range 2 {
		if err := l.EnsureDummy(ctx, dev); err != nil {
			t.Fatalf("EnsureDummy: %v", err)
		}
	}
	out := kerneltest.Run(t, "ip", "-n", ns, "-d", "link", "show", dev)
	if !strings.Contains(out, "dummy") && !strings.Contains(out, "bridge") {
		t.Errorf("%s is neither a dummy nor a bridge:\n%s", dev, out)
	}
	vips := []netip.Addr{netip.MustParseAddr("198.18.7.1"), netip.MustParseAddr("fd00:7::1")}
	for _, a := range vips {
		for range 2 {
			if err := l.AddAddr(ctx, dev, a); err != nil {
				t.Fatalf("AddAddr %v: %v", a, err)
			}
		}
	}
	got, err := l.Addrs(ctx, dev)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range vips {
		if !slices.Contains(got, a) {
			t.Errorf("Addrs: %v, want %v among them", got, a)
		}
	}
	// Listened on at once, the IPv6 one too (no duplicate address
	// detection keeping it tentative), and reached. The kernel installs an
	// IPv6 address's local route from a work queue after the address is
	// added (addrconf's DAD work, which a NODAD address completes at
	// once), so a connect in the first moments may find no route
	// (ENETUNREACH): allowed for up to a second.
	kerneltest.Do(t, ns, func() {
		for _, a := range vips {
			ln, err := net.Listen("tcp", netip.AddrPortFrom(a, 80).String())
			if err != nil {
				t.Errorf("listening on %v right after adding it: %v", a, err)
				continue
			}
			c, err := net.Dial("tcp", ln.Addr().String())
			for start := time.Now(); errors.Is(err, syscall.ENETUNREACH) && time.Since(start) < time.Second; {
				time.Sleep(5 * time.Millisecond)
				c, err = net.Dial("tcp", ln.Addr().String())
			}
			if err != nil {
				t.Errorf("connecting to %v: %v", a, err)
			} else {
				c.Close()
			}
			ln.Close()
		}
	})
	if err := l.DelAddr(ctx, dev, vips[0]); err != nil {
		t.Fatalf("DelAddr: %v", err)
	}
	if err := l.DelAddr(ctx, dev, vips[0]); err != nil {
		t.Fatalf("DelAddr of an address not there: %v", err)
	}
	if got, _ := l.Addrs(ctx, dev); slices.Contains(got, vips[0]) {
		t.Errorf("%v still there after DelAddr: %v", vips[0], got)
	}
	for range 2 {
		if err := l.DeleteLink(ctx, dev); err != nil {
			t.Fatalf("DeleteLink: %v", err)
		}
	}
	if out := kerneltest.Run(t, "ip", "-n", ns, "addr"); strings.Contains(out, "fd00:7::1") {
		t.Errorf("the address outlived its interface:\n%s", out)
	}
}

// TestPrivilegedEnsureDummyRefusesOthers: an interface of the name that is
// something else (a veth, a bridge with a port) is not taken over.
func TestPrivilegedEnsureDummyRefusesOthers(t *testing.T) {
	ctx := context.Background()
	l, ns := inNS(t)
	kerneltest.Run(t, "ip", "-n", ns, "link", "add", "vethx", "type", "veth", "peer", "name", "vethy")
	if err := l.EnsureDummy(ctx, "vethx"); err == nil || !strings.Contains(err.Error(), "not a dummy") {
		t.Errorf("EnsureDummy over a veth: %v, want refused", err)
	}
	kerneltest.Run(t, "ip", "-n", ns, "link", "add", "brx", "type", "bridge")
	if err := l.EnsureDummy(ctx, "brx"); err != nil {
		t.Errorf("EnsureDummy over an empty bridge (its stand-in): %v", err)
	}
	kerneltest.Run(t, "ip", "-n", ns, "link", "set", "vethy", "master", "brx")
	if err := l.EnsureDummy(ctx, "brx"); err == nil {
		t.Error("EnsureDummy over a bridge with a port: nil, want refused")
	}
}

// TestPrivilegedLocalAddrs: the node's addresses are read before
// WatchLocalAddrs returns and follow additions and removals, of both
// families, the removal of an interface with its addresses, and an address
// held by two interfaces, which stays local while either holds it. Every
// loopback address is local; the namespace's other addresses are not.
func TestPrivilegedLocalAddrs(t *testing.T) {
	l, ns := inNS(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	before := netip.MustParseAddr("198.18.8.1")
	if err := l.EnsureDummy(ctx, "svcproxy-t0"); err != nil {
		t.Fatal(err)
	}
	if err := l.AddAddr(ctx, "svcproxy-t0", before); err != nil {
		t.Fatal(err)
	}
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	watchErrs := make(chan error, 1)
	local, err := iface.WatchLocalAddrs(ctx, h, func(err error) {
		select {
		case watchErrs <- err:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"198.18.8.1", "127.0.0.1", "127.3.2.1", "::1", "::ffff:198.18.8.1"} {
		if !local.Has(netip.MustParseAddr(a)) {
			t.Errorf("Has(%s) = false at once, want true", a)
		}
	}
	// until waits for the set to say want for each address.
	until := func(what string, want bool, addrs ...netip.Addr) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for _, a := range addrs {
			for local.Has(a) != want {
				if time.Now().After(deadline) {
					t.Fatalf("%s: Has(%v) = %v after 5s, want %v", what, a, !want, want)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
	v4, v6 := netip.MustParseAddr("198.18.8.2"), netip.MustParseAddr("fd00:8::2")
	until("not added yet", false, v4, v6, netip.MustParseAddr("198.18.9.9"))
	for _, a := range []netip.Addr{v4, v6} {
		if err := l.AddAddr(ctx, "svcproxy-t0", a); err != nil {
			t.Fatal(err)
		}
	}
	until("added", true, v4, v6)
	if err := l.DelAddr(ctx, "svcproxy-t0", v6); err != nil {
		t.Fatal(err)
	}
	until("removed", false, v6)
	// v4 on a second interface too: removing the first keeps it local.
	if err := l.EnsureDummy(ctx, "svcproxy-t1"); err != nil {
		t.Fatal(err)
	}
	if err := l.AddAddr(ctx, "svcproxy-t1", v4); err != nil {
		t.Fatal(err)
	}
	if err := l.DeleteLink(ctx, "svcproxy-t0"); err != nil {
		t.Fatal(err)
	}
	until("its interface deleted", false, before)
	if !local.Has(v4) {
		t.Errorf("Has(%v) = false while another interface holds it", v4)
	}
	if err := l.DeleteLink(ctx, "svcproxy-t1"); err != nil {
		t.Fatal(err)
	}
	until("both interfaces deleted", false, v4)
	select {
	case err := <-watchErrs:
		t.Errorf("the watch reported %v", err)
	default:
	}
}

// TestPrivilegedLocalAddrsOverflow: when the kernel drops address
// notifications (the socket's buffer full: here a buffer of the kernel's
// minimum, and bursts of a thousand addresses), the watch says so,
// subscribes again and reads every address anew, so the set ends up whole.
func TestPrivilegedLocalAddrsOverflow(t *testing.T) {
	l, ns := inNS(t)
	defer iface.SetAddrSocketBuffer(1)()
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // first: the watch stops before its handle closes
	if err := l.EnsureDummy(ctx, "svcproxy-t0"); err != nil {
		t.Fatal(err)
	}
	var brokeOff atomic.Int32
	local, err := iface.WatchLocalAddrs(ctx, h, func(err error) {
		if strings.Contains(err.Error(), "broke off") {
			brokeOff.Add(1)
		} else {
			t.Errorf("the watch reported %v", err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	var added []netip.Addr
	for burst := 0; brokeOff.Load() == 0; burst++ {
		if burst == 20 {
			t.Fatalf("%d addresses added in bursts of 1,000 overflowed no notification socket of the kernel's minimum size", len(added))
		}
		var cmds strings.Builder
		for range 1000 {
			i := len(added)
			a := netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
			added = append(added, a)
			fmt.Fprintf(&cmds, "address add %v/32 dev svcproxy-t0\n", a)
		}
		cmd := exec.Command("ip", "-n", ns, "-batch", "-")
		cmd.Stdin = strings.NewReader(cmds.String())
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("adding addresses: %v: %s", err, out)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, a := range added {
		for !local.Has(a) {
			if time.Now().After(deadline) {
				t.Fatalf("Has(%v) = false 10s after adding %d addresses (notifications broke off %d times); the set holds %d", a, len(added), brokeOff.Load(), local.Len())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	t.Logf("%d addresses; notifications broke off %d times", len(added), brokeOff.Load())
}
