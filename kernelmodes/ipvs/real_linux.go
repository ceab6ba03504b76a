package ipvs

import (
	"fmt"
	"os/exec"
	"strings"

	"github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Available reports whether this kernel has IPVS: nil when its generic
// netlink family is registered (after trying `modprobe ip_vs`, as
// kube-proxy does, when it is not), else an error wrapping ErrUnavailable
// that says why. It looks at the caller's network namespace.
func Available() error {
	err := ipvsFamily()
	if err == nil {
		return nil
	}
	if path, lerr := exec.LookPath("modprobe"); lerr == nil {
		if out, merr := exec.Command(path, "ip_vs").CombinedOutput(); merr != nil {
			err = fmt.Errorf("%w (modprobe ip_vs: %v: %s)", err, merr, strings.TrimSpace(string(out)))
		} else if err = ipvsFamily(); err == nil {
			return nil
		}
	}
	return fmt.Errorf("%w: the kernel has no IPVS netlink family (ip_vs is neither built in nor loaded): %v", ErrUnavailable, err)
}

func ipvsFamily() error {
	h, err := netlink.NewHandle(unix.NETLINK_GENERIC)
	if err != nil {
		return fmt.Errorf("opening a generic netlink socket: %w", err)
	}
	defer h.Close()
	if _, err := h.GenlFamilyGet("IPVS"); err != nil {
		return fmt.Errorf("looking up the IPVS generic netlink family: %w", err)
	}
	return nil
}

// NewIPVS returns a moby/ipvs handle in the caller's network namespace, or
// an error wrapping ErrUnavailable when the kernel has no IPVS. (moby/ipvs
// looks the IPVS netlink family up once per process: create the first
// handle after loading ip_vs.)
func NewIPVS() (*ipvs.Handle, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	h, err := ipvs.New("")
	if err != nil {
		return nil, fmt.Errorf("opening IPVS netlink socket: %w", err)
	}
	return h, nil
}

// KernelRelease is the running kernel's release (uname -r); "" when
// uname fails.
func KernelRelease() string {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return ""
	}
	return unix.ByteSliceToString(uts.Release[:])
}
