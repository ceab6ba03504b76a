package vmtest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The guest side: what a test program running as /init calls.

// ModuleOrder is the file in the initramfs listing the modules to load, one
// "name path" a line, dependencies first.
const ModuleOrder = "/modules/order"

// AddModules puts mods into the initramfs under /modules with the
// ModuleOrder file LoadModules reads.
func (r *Initramfs) AddModules(mods []Module) {
	var order strings.Builder
	for _, m := range mods {
		p := "/modules/" + m.Name + ".ko"
		r.AddFileFrom(p, m.Path, 0o644)
		fmt.Fprintf(&order, "%s %s\n", m.Name, p)
	}
	r.AddFile(ModuleOrder, []byte(order.String()), 0o644)
}

// MountBasics mounts /proc, /sys and tmpfs on /run and /tmp.
func MountBasics() error {
	for _, m := range []struct{ src, dst, fstype string }{
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
		{"tmpfs", "/run", "tmpfs"},
		{"tmpfs", "/tmp", "tmpfs"},
	} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.src, m.dst, m.fstype, 0, ""); err != nil {
			return fmt.Errorf("mounting %s: %w", m.dst, err)
		}
	}
	return nil
}

// LoadModules loads the modules ModuleOrder lists with finit_module, in
// order; one already loaded is fine. It returns the names loaded.
func LoadModules() ([]string, error) {
	b, err := os.ReadFile(ModuleOrder)
	if err != nil {
		return nil, err
	}
	var loaded []string
	for line := range strings.Lines(string(b)) {
		name, p, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		f, err := os.Open(p)
		if err != nil {
			return loaded, err
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return loaded, fmt.Errorf("loading module %s: %w", name, err)
		}
		loaded = append(loaded, name)
	}
	return loaded, nil
}

// Reporter prints check results on the console in the form ParseResults
// reads.
type Reporter struct {
	mu         sync.Mutex
	w          io.Writer
	start      time.Time
	pass, fail int
}

// NewReporter reports to w (the console: os.Stdout of /init).
func NewReporter(w io.Writer) *Reporter { return &Reporter{w: w, start: time.Now()} }

func (r *Reporter) line(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintln(r.w, strings.ReplaceAll(s, "\n", " | "))
}

// Pass reports a passed check.
func (r *Reporter) Pass(name string) {
	r.mu.Lock()
	r.pass++
	r.mu.Unlock()
	r.line(PrefixPass + name)
}

// Fail reports a failed check.
func (r *Reporter) Fail(name, format string, args ...any) {
	r.mu.Lock()
	r.fail++
	r.mu.Unlock()
	r.line(PrefixFail + name + ": " + fmt.Sprintf(format, args...))
}

// Check reports name as passed when err is nil, else failed with err.
func (r *Reporter) Check(name string, err error) bool {
	if err != nil {
		r.Fail(name, "%v", err)
		return false
	}
	r.Pass(name)
	return true
}

// Note prints information that is neither a pass nor a failure.
func (r *Reporter) Note(format string, args ...any) {
	r.line(PrefixNote + fmt.Sprintf(format, args...))
}

// Done prints the summary line; print nothing after it.
func (r *Reporter) Done() {
	r.mu.Lock()
	p, f := r.pass, r.fail
	r.mu.Unlock()
	r.line(fmt.Sprintf("%s pass=%d fail=%d guest_seconds=%.1f", LineDone, p, f, time.Since(r.start).Seconds()))
}

// PowerOff ends the VM: with QEMU's -no-reboot, a reboot ends QEMU.
func PowerOff() {
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	// Still here (not PID 1?): exit, which panics the kernel, which
	// reboots (panic=-1).
	os.Exit(1)
}

// NewNetNS creates a network namespace without entering it.
func NewNetNS() (netns.NsHandle, error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return netns.None(), err
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		runtime.UnlockOSThread()
		return netns.None(), err
	}
	if err := netns.Set(orig); err != nil {
		panic(fmt.Sprintf("cannot return to the initial namespace: %v", err)) // the thread stays locked and dies
	}
	runtime.UnlockOSThread()
	return ns, nil
}

// StartGuest begins a guest /init's main: it exits unless the program runs
// as PID 1, sets PATH, and returns the console Reporter and the function
// main must defer, which reports a panic as a failure, says DONE and
// powers the VM off.
func StartGuest(name string) (*Reporter, func()) {
	if os.Getpid() != 1 {
		fmt.Fprintf(os.Stderr, "%s is the /init of a VM and runs only as PID 1 inside it\n", name)
		os.Exit(2)
	}
	os.Setenv("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
	r := NewReporter(os.Stdout)
	return r, func() {
		if p := recover(); p != nil {
			r.Fail("guest", "panic: %v", p)
		}
		r.Done()
		PowerOff()
	}
}

// Guest is a guest /init's runner: the boot steps every VM test program
// takes, then its scenario.
type Guest struct {
	// Name says what the program is, in its refusal to run anywhere but
	// as a VM's PID 1.
	Name string
	// Modules: load the modules ModuleOrder lists (the initramfs has them).
	Modules bool
}

// Run is the whole of a guest /init's main: StartGuest, MountBasics, a
// note with KernelNote, the modules when g.Modules (a "step" note says
// how many, in how long, which), then scenario with the console Reporter;
// an error from it fails the check "setup". Then DONE, and the VM powers
// off. A failed boot step is reported and skips the scenario.
func (g Guest) Run(scenario func(r *Reporter) error) {
	r, done := StartGuest(g.Name)
	defer done()
	if !r.Check("mount /proc, /sys", MountBasics()) {
		return
	}
	r.Note("%s", KernelNote())
	if g.Modules {
		start := time.Now()
		mods, err := LoadModules()
		if !r.Check("load modules", err) {
			return
		}
		r.Note("step loaded %d modules in %v: %s", len(mods), time.Since(start).Round(time.Millisecond), strings.Join(mods, " "))
	}
	if err := scenario(r); err != nil {
		r.Fail("setup", "%v", err)
	}
}

// KernelNote says which kernel runs and how long after boot /init started
// (once /proc is mounted).
func KernelNote() string {
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	uptime, _ := os.ReadFile("/proc/uptime")
	up, _, _ := strings.Cut(string(uptime), " ")
	return fmt.Sprintf("kernel %s, /init started %ss after boot", unix.ByteSliceToString(uts.Release[:]), up)
}

// initialNetNS is the guest's initial network namespace (PID 1's), opened
// once, after /proc is mounted.
var initialNetNS = sync.OnceValues(func() (netns.NsHandle, error) { return netns.GetFromPath("/proc/1/ns/net") })

// InNetNS runs fn on a thread in ns (netns.None(): the initial namespace,
// where fn runs as is): sockets fn creates belong to ns. The thread goes
// back to the initial namespace afterwards.
func InNetNS(ns netns.NsHandle, fn func() error) error {
	if ns == netns.None() {
		return fn()
	}
	initial, err := initialNetNS()
	if err != nil {
		return fmt.Errorf("opening the initial network namespace: %w", err)
	}
	runtime.LockOSThread()
	if err := netns.Set(ns); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	ferr := fn()
	if err := netns.Set(initial); err != nil {
		panic(fmt.Sprintf("cannot return to the initial namespace: %v", err)) // the thread stays locked and dies
	}
	runtime.UnlockOSThread()
	return ferr
}

// HostRoute is a /32 route to dst through link, scope link: the route each
// end of a CNI-ptp-shaped veth pair needs to the other.
func HostRoute(link netlink.Link, dst netip.Addr) *netlink.Route {
	return &netlink.Route{LinkIndex: link.Attrs().Index, Dst: &net.IPNet{IP: dst.AsSlice(), Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK}
}
