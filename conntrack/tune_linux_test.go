package conntrack_test

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/internal/kerneltest"
	"github.com/svcproxy/svcproxy/sysctl"
)

var privileged = kerneltest.Gate{
	Package: "./conntrack/",
	Prefix:  "svcproxy-ct-",
	Tools:   []string{"ip"},
	Probe: func(string) error {
		if _, err := (sysctl.Files{}).Sysctl(conntrack.TCPCloseWaitSysctl); err != nil {
			return errors.New("the kernel has no connection tracking (nf_conntrack): " + err.Error())
		}
		return nil
	},
}

// TestPrivilegedTune runs Tune on the real files, in a namespace of its
// own: the timeouts are the namespace's to set, the table's size is the
// node's first namespace's, and nothing of the node's own changes.
func TestPrivilegedTune(t *testing.T) {
	privileged.Require(t)
	node := map[string]string{}
	names := []string{conntrack.MaxSysctl, conntrack.TCPEstablishedSysctl, conntrack.TCPCloseWaitSysctl, conntrack.UDPSysctl}
	for _, n := range names {
		v, err := (sysctl.Files{}).Sysctl(n)
		if err != nil {
			t.Fatal(err)
		}
		node[n] = v
	}
	hash, err := sysctl.Module.Sysctl(conntrack.HashsizeParam)
	if err != nil {
		t.Fatal(err)
	}
	ns := privileged.NewNS(t)
	t.Cleanup(func() { // should a check below fail, the node gets its own back
		for _, n := range names {
			if v, _ := (sysctl.Files{}).Sysctl(n); v != node[n] {
				_ = (sysctl.Files{}).SetSysctl(n, node[n])
			}
		}
		if v, _ := sysctl.Module.Sysctl(conntrack.HashsizeParam); v != hash {
			_ = sysctl.Module.SetSysctl(conntrack.HashsizeParam, hash)
		}
	})
	// inNS fails t unless this thread is in a network namespace other than
	// the test process's.
	own, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	inNS := func(t *testing.T) {
		if here, err := os.Readlink("/proc/thread-self/ns/net"); err != nil || here == own {
			t.Fatalf("not in the test's namespace (%s, %v; the process's is %s): nothing is tuned", here, err, own)
		}
	}

	t.Run("timeouts are set in the namespace", func(t *testing.T) {
		kerneltest.Do(t, ns, func() {
			inNS(t)
			tun := conntrack.Tuning{TCPEstablished: 24 * time.Hour, TCPCloseWait: time.Hour, UDP: 47 * time.Second}
			changed, failed := conntrack.Tune(tun, 1, sysctl.Files{}, sysctl.Module)
			if failed != nil {
				t.Errorf("Tune: %v", failed)
			}
			if len(changed) != 3 {
				t.Errorf("changed %q, want the three timeouts", changed)
			}
			for name, want := range map[string]string{conntrack.TCPEstablishedSysctl: "86400", conntrack.TCPCloseWaitSysctl: "3600", conntrack.UDPSysctl: "47"} {
				if got, err := (sysctl.Files{}).Sysctl(name); err != nil || got != want {
					t.Errorf("in the namespace, %s = %q (%v), want %q", name, got, err, want)
				}
			}
			// Again: nothing to write.
			if changed, failed := conntrack.Tune(tun, 1, sysctl.Files{}, sysctl.Module); len(changed) != 0 || failed != nil {
				t.Errorf("second Tune changed %q (%v), want nothing", changed, failed)
			}
		})
	})

	t.Run("the table's size is refused outside the node's first namespace", func(t *testing.T) {
		kerneltest.Do(t, ns, func() {
			inNS(t)
			_, failed := conntrack.Tune(conntrack.Tuning{MaxPerCore: 1 << 22, Min: 1}, 2, sysctl.Files{}, sysctl.Module)
			if len(failed) != 2 {
				t.Fatalf("Tune: %v, want two failures: the table's size is not this namespace's to raise", failed)
			}
			for i, want := range []string{"setting " + conntrack.MaxSysctl + " to 8388608", "setting " + conntrack.HashsizeParam + " to 2097152"} {
				if !strings.Contains(failed[i].Error(), want) {
					t.Errorf("error %q does not name %q", failed[i], want)
				}
			}
			if !errors.Is(failed[0], syscall.EACCES) {
				t.Errorf("error %q is not EACCES (nf_conntrack_max is read-only here)", failed[0])
			}
		})
	})

	for _, n := range names {
		if v, _ := (sysctl.Files{}).Sysctl(n); v != node[n] {
			t.Errorf("the node's %s changed: %q, was %q", n, v, node[n])
		}
	}
	if v, _ := sysctl.Module.Sysctl(conntrack.HashsizeParam); v != hash {
		t.Errorf("the node's hashsize changed: %q, was %q", v, hash)
	}
}
