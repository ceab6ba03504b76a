package vmtest

import (
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// TestPrivilegedGuestHost builds a guest host around a throwaway "node"
// namespace (never the caller's) and connects from the host to the node
// over the ptp veth; Close removes the veth.
func TestPrivilegedGuestHost(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces and veths (run `sudo go test ./internal/vmtest/`)")
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer orig.Close()
	node, err := netns.New() // this thread is now in the throwaway node
	if err != nil {
		runtime.UnlockOSThread()
		t.Skipf("cannot create a network namespace: %v", err)
	}
	defer node.Close()
	defer func() {
		if err := netns.Set(orig); err != nil {
			t.Errorf("leaving the node namespace: %v", err) // the thread stays locked and dies
			return
		}
		runtime.UnlockOSThread()
	}()

	nodeIP, podIP := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.1.1")
	h, err := AddGuestHost("pod", podIP, nodeIP)
	if err != nil {
		t.Fatalf("AddGuestHost: %v", err)
	}
	if h.Name != "pod" || h.IP != podIP || h.Link != "v-pod" {
		t.Errorf("got %+v", h)
	}
	ln, err := net.Listen("tcp4", netip.AddrPortFrom(nodeIP, 0).String()) // in the node
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan netip.AddrPort, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- netip.MustParseAddrPort(c.RemoteAddr().String())
		c.Close()
	}()
	if err := netns.Set(h.NS); err != nil {
		t.Fatal(err)
	}
	c, derr := net.Dial("tcp4", ln.Addr().String()) // from the pod
	if err := netns.Set(node); err != nil {
		t.Fatalf("back to the node: %v", err)
	}
	if derr != nil {
		t.Fatalf("dialing the node from the pod: %v", derr)
	}
	c.Close()
	if from := <-accepted; from.Addr() != podIP {
		t.Errorf("the node saw a connection from %v, want %v", from, podIP)
	}

	h.Close()
	if _, err := netlink.LinkByName("v-pod"); err == nil {
		t.Error("Close left the veth")
	}
}
