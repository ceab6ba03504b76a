package topology

import (
	"context"
	"net"
	"os/exec"
)

// Command returns a command that runs name inside h's namespace, as
// `ip netns exec NS name args...` (which execs name in place, so ctx's
// cancellation and Process reach the program itself). Close kills it if it
// is still running inside the namespace then; Start it before Close, and
// wait until it is in (it says so on stdout, say) if Close may race it.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
}

// Dial connects from inside h's namespace. addr should hold an IP address,
// not a name: the socket is made in h's namespace, a resolver's are not.
func (h *Host) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := h.Do(func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen listens inside h's namespace; the listener keeps working there
// after Listen returns.
func (h *Host) Listen(ctx context.Context, network, addr string) (net.Listener, error) {
	var l net.Listener
	err := h.Do(func() (err error) {
		var lc net.ListenConfig
		l, err = lc.Listen(ctx, network, addr)
		return err
	})
	return l, err
}

// ListenPacket is Listen for packet sockets (udp, ip, unixgram).
func (h *Host) ListenPacket(ctx context.Context, network, addr string) (net.PacketConn, error) {
	var c net.PacketConn
	err := h.Do(func() (err error) {
		var lc net.ListenConfig
		c, err = lc.ListenPacket(ctx, network, addr)
		return err
	})
	return c, err
}
