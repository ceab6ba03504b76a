package conntrack

import (
	"fmt"
	"strconv"
	"time"

	"github.com/svcproxy/svcproxy/sysctl"
)

// Tuning is kube-proxy's conntrack section (KubeProxyConntrackConfiguration):
// the size and timeouts of the kernel's connection tracking, which
// kube-proxy sets at start in every mode, and Tune sets the same way.
type Tuning struct {
	// MaxPerCore and Min size the table: nf_conntrack_max becomes at least
	// max(MaxPerCore × CPUs, Min), and the hash table (the nf_conntrack
	// module's hashsize) at least a quarter of that. MaxPerCore 0: both
	// are left alone.
	MaxPerCore, Min int
	// Timeouts (nf_conntrack_tcp_timeout_established, _close_wait,
	// nf_conntrack_udp_timeout, _stream), in whole seconds; 0: left alone.
	TCPEstablished, TCPCloseWait, UDP, UDPStream time.Duration
	// TCPBeLiberal sets nf_conntrack_tcp_be_liberal to 1, so packets
	// outside the TCP window are no longer INVALID; false: left alone.
	TCPBeLiberal bool
}

// DefaultTuning is kube-proxy's defaults: a table of 32,768 entries per
// CPU (131,072 at least), established TCP entries kept a day instead of
// the kernel's five, and half-closed ones an hour instead of a minute, so
// a long-lived connection one side has closed keeps its translation.
var DefaultTuning = Tuning{MaxPerCore: 32 * 1024, Min: 128 * 1024, TCPEstablished: 24 * time.Hour, TCPCloseWait: time.Hour}

// Params reads and writes named kernel parameters as text; sysctl.Files is
// the real one, sysctltest.Params the in-memory one.
type Params = sysctl.Params

// The parameters Tune sets: sysctls under /proc/sys, and the module
// parameter under /sys/module.
const (
	MaxSysctl            = "net/netfilter/nf_conntrack_max"
	HashsizeParam        = "nf_conntrack/parameters/hashsize"
	TCPEstablishedSysctl = "net/netfilter/nf_conntrack_tcp_timeout_established"
	TCPCloseWaitSysctl   = "net/netfilter/nf_conntrack_tcp_timeout_close_wait"
	TCPBeLiberalSysctl   = "net/netfilter/nf_conntrack_tcp_be_liberal"
	UDPSysctl            = "net/netfilter/nf_conntrack_udp_timeout"
	UDPStreamSysctl      = "net/netfilter/nf_conntrack_udp_timeout_stream"
)

// Tune sets what t asks of a node with cpus CPUs through sysctls
// (/proc/sys) and modules (/sys/module), and returns what it changed, each
// as "name=new (was old)", and an error for each parameter it could not
// set, naming it. A parameter already at its value is not written. It goes
// on past a parameter it cannot set: /proc/sys is read-only in a container
// that is not privileged, and the table's size belongs to the node's first
// network namespace (elsewhere nf_conntrack_max is read-only and hashsize
// refuses writes), while the timeouts are each namespace's own.
//
// Unlike kube-proxy, which sets nf_conntrack_max to exactly what it
// computed, Tune only raises the table's size: a node given a bigger table
// keeps it.
func Tune(t Tuning, cpus int, sysctls, modules Params) (changed []string, failed []error) {
	set := func(p Params, name string, want int, raiseOnly bool) {
		var keep func(string) bool
		if raiseOnly {
			keep = func(now string) bool {
				n, err := strconv.Atoi(now)
				return err == nil && (n > want || name == MaxSysctl && n == 0) // (nf_conntrack_max 0: no limit)
			}
		}
		old, wrote, err := sysctl.Ensure(p, name, strconv.Itoa(want), keep)
		switch {
		case err != nil:
			failed = append(failed, err)
		case wrote && old == "":
			changed = append(changed, fmt.Sprintf("%s=%d", name, want))
		case wrote:
			changed = append(changed, fmt.Sprintf("%s=%d (was %s)", name, want, old))
		}
	}
	if t.MaxPerCore > 0 {
		size := max(t.MaxPerCore*max(cpus, 1), t.Min)
		set(sysctls, MaxSysctl, size, true)
		set(modules, HashsizeParam, size/4, true)
	}
	for _, s := range []struct {
		name string
		d    time.Duration
	}{
		{TCPEstablishedSysctl, t.TCPEstablished},
		{TCPCloseWaitSysctl, t.TCPCloseWait},
		{UDPSysctl, t.UDP},
		{UDPStreamSysctl, t.UDPStream},
	} {
		if secs := int(s.d / time.Second); secs > 0 {
			set(sysctls, s.name, secs, false)
		}
	}
	if t.TCPBeLiberal {
		set(sysctls, TCPBeLiberalSysctl, 1, false)
	}
	return changed, failed
}
