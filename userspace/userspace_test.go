package userspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/svcproxy/svcproxy/conntrack/conntracktest"
	"github.com/svcproxy/svcproxy/forwarder"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/netfilter/netfiltertest"
	"github.com/svcproxy/svcproxy/redirect"
	"github.com/svcproxy/svcproxy/redirect/steertable"
	"github.com/svcproxy/svcproxy/redirect/steertable/steertabletest"
)

// TestMode serves a loopback Service without steering (the forwarder binds
// the frontend itself) through Apply, then Close drains the forwarder and
// the frontend refuses connections.
func TestMode(t *testing.T) {
	backend, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	go func() {
		for {
			c, err := backend.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	front := probe.Addr().(*net.TCPAddr).AddrPort()
	probe.Close()

	m, err := New(Config{Forwarder: forwarder.Config{Workers: 1, Mark: -1, DrainTimeout: time.Second, Logger: zaptest.NewLogger(t)}, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Available(context.Background()); err != nil {
		t.Errorf("Available without steering: %v, want nil", err)
	}
	if m.Steering() != nil {
		t.Error("Steering() without steering is not nil")
	}
	store := lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: "node-a"}})
	snap, err := store.Replace([]lb.Service{{Name: lb.ServicePortName{Namespace: "ns", Name: "echo"}, Protocol: lb.TCP, Port: front.Port(),
		ClusterIPs: []netip.Addr{front.Addr()},
		Endpoints:  []lb.Endpoint{{Addr: backend.Addr().(*net.TCPAddr).AddrPort(), Ready: true, Serving: true}}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := m.Apply(ctx, snap, true); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	c, err := net.DialTimeout("tcp", front.String(), 2*time.Second)
	if err != nil {
		t.Fatalf("dialing the Service at %v: %v", front, err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "ping"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through the Service: %q, %v", buf, err)
	}
	c.Close()

	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := m.Close(sctx, false); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if c, err := net.DialTimeout("tcp", front.String(), time.Second); err == nil {
		c.Close()
		t.Fatalf("the frontend %v still accepts after Close", front)
	} else if !strings.Contains(err.Error(), "refused") {
		t.Logf("dial after Close: %v", err)
	}
}

// TestAvailableSteering: with steering, the mode is available when a
// steering backend works here under the configured choice: auto and
// nftables pass where the kernel takes the steering table even with no
// iptables at all; iptables needs iptables; with neither, the error names
// both reasons. The backends are their fakes (no root needed).
func TestAvailableSteering(t *testing.T) {
	noIPTables := errors.New("exec: \"iptables\": executable file not found in $PATH")
	noNFT := errors.New("netlink: operation not supported")
	for _, tc := range []struct {
		name          string
		backend       redirect.Backend
		iptables, nft error  // what the iptables version and the table probe say
		want          string // "" available, else a part of the error
	}{
		{"auto, nftables, no iptables", redirect.BackendAuto, noIPTables, nil, ""},
		{"nftables, no iptables", redirect.BackendNFTables, noIPTables, nil, ""},
		{"auto, iptables, no nftables", redirect.BackendAuto, nil, noNFT, ""},
		{"iptables, no iptables", redirect.BackendIPTables, noIPTables, nil, "iptables"},
		{"nftables, no nftables", redirect.BackendNFTables, nil, noNFT, "operation not supported"},
		{"auto, neither", redirect.BackendAuto, noIPTables, noNFT, "operation not supported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ipt, nft := netfiltertest.NewFake(), steertabletest.NewFake()
			if tc.iptables != nil {
				ipt.FailNext("iptables-version", tc.iptables)
			}
			nft.Fail("probe", tc.nft)
			err := Available(context.Background(), &redirect.Config{Backend: tc.backend, Mark: forwarder.DefaultMark, Exec: ipt, NFT: nft})
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Available = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Available = %v, want an error saying %q", err, tc.want)
			}
			if tc.name == "auto, neither" && (err == nil || !strings.Contains(err.Error(), "not found")) {
				t.Errorf("Available = %v, want both reasons", err)
			}
		})
	}
	if err := Available(context.Background(), nil); err != nil {
		t.Errorf("Available without steering = %v, want nil", err)
	}
}

// TestRedirectLeftToSuccessor: once the mode has stopped accepting (its
// successor serves), an Apply does not write the steering table, and
// Close leaves the table to the successor; without a successor, an Apply
// after Close removed the table does not put it back.
func TestRedirectLeftToSuccessor(t *testing.T) {
	ctx := context.Background()
	web := lb.Service{Name: lb.ServicePortName{Namespace: "ns", Name: "web"}, Protocol: lb.TCP, Port: 80,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("198.18.5.1")},
		Endpoints:  []lb.Endpoint{{Addr: netip.MustParseAddrPort("198.18.6.1:8080"), Ready: true, Serving: true}}}
	for _, handedOver := range []bool{true, false} {
		t.Run(fmt.Sprintf("handedOver=%v", handedOver), func(t *testing.T) {
			nft := steertabletest.NewFake()
			probe, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			port := uint16(probe.Addr().(*net.TCPAddr).Port)
			probe.Close()
			m, err := New(Config{
				RedirectPort: port,
				Forwarder:    forwarder.Config{Workers: 1, Mark: -1, DrainTimeout: time.Second, Logger: zaptest.NewLogger(t)},
				Steering:     &redirect.Config{Backend: redirect.BackendNFTables, Mark: forwarder.DefaultMark, Exec: netfiltertest.NewFake(), NFT: nft, Conntrack: &conntracktest.Table{}},
				Logger:       zaptest.NewLogger(t),
			})
			if err != nil {
				t.Fatal(err)
			}
			store := lb.NewStore(lb.StoreOptions{})
			if err := m.Apply(ctx, snapshotOf(t, store, web), true); err != nil {
				t.Fatal(err)
			}
			if n := nft.Len(netfilter.IPv4, steertable.SetFrontends); n != 1 {
				t.Fatalf("%d frontends steered, want 1", n)
			}
			if handedOver {
				m.StopAccepting()
			} else if err := m.Close(ctx, false); err != nil {
				t.Fatalf("Close: %v", err)
			}
			writes := func() int { return nft.Count("setup") + nft.Count("update") + nft.Count("delete") }
			before := writes()
			// The old process's view, lagging the successor's: web gone.
			if err := m.Apply(ctx, snapshotOf(t, store), true); err != nil {
				t.Fatalf("Apply after stopping: %v", err)
			}
			if handedOver {
				if err := m.Close(ctx, true); err != nil {
					t.Fatalf("Close: %v", err)
				}
			}
			if got := writes() - before; got != 0 {
				t.Errorf("after stopping, %d writes to the steering table, want 0", got)
			}
			switch n := nft.Len(netfilter.IPv4, steertable.SetFrontends); {
			case handedOver && n != 1:
				t.Errorf("%d frontends steered after handing over, want 1 kept for the successor", n)
			case !handedOver && nft.Has(netfilter.IPv4):
				t.Errorf("the steering table is back after Close: %s", nft.Dump())
			}
		})
	}
}
