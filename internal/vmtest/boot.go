package vmtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// QEMU is the emulator Boot runs.
const QEMU = "qemu-system-x86_64"

// ErrNoQEMU: qemu-system-x86_64 is not installed. Tests skip on it.
var ErrNoQEMU = errors.New(QEMU + " is not installed (Debian package qemu-system-x86)")

// HaveQEMU reports whether QEMU is installed, wrapping ErrNoQEMU when not.
func HaveQEMU() error {
	if _, err := exec.LookPath(QEMU); err != nil {
		return ErrNoQEMU
	}
	return nil
}

// BootOptions configure Boot.
type BootOptions struct {
	Kernel string // a bzImage (vmlinuz)
	Initrd string // the initramfs
	// Append is added to the kernel command line after
	// "console=ttyS0 panic=-1".
	Append   string
	MemoryMB int           // zero: 512
	Timeout  time.Duration // zero: 3 minutes; the VM is killed then
	// Console receives the serial console line by line as it arrives (the
	// guest's /init output and kernel messages); nil: discarded.
	Console func(line string)
	// SilentLimit: a guest that has printed no "VMTEST " line this long
	// after QEMU started is taken for a boot that hung (TCG has been seen
	// to stop before /init ran, once in many runs, with nothing on the
	// console): QEMU is killed and the guest booted once more. Zero: 4
	// minutes, or the whole Timeout if that is shorter (no retry).
	SilentLimit time.Duration
}

// qemuCommand builds the QEMU command (tests replace it).
var qemuCommand = exec.CommandContext

// errSilent is a boot whose guest printed nothing of its own in time.
var errSilent = errors.New("the guest printed nothing")

// Boot runs the kernel under QEMU with TCG (no KVM), no network device and
// the serial console on stdio, and returns the console output once the
// guest powers off or reboots (-no-reboot makes either end QEMU). A kernel
// panic reboots at once (panic=-1), so a crashed /init ends the run too.
func Boot(ctx context.Context, o BootOptions) (string, error) {
	if err := HaveQEMU(); err != nil {
		return "", err
	}
	if o.MemoryMB == 0 {
		o.MemoryMB = 512
	}
	if o.Timeout == 0 {
		o.Timeout = 3 * time.Minute
	}
	return bootRetrying(ctx, o)
}

// bootRetrying boots, and boots once more if the first guest stayed silent.
func bootRetrying(ctx context.Context, o BootOptions) (string, error) {
	if o.SilentLimit == 0 {
		o.SilentLimit = 4 * time.Minute
	}
	out, err := boot(ctx, o)
	if errors.Is(err, errSilent) && ctx.Err() == nil {
		note := fmt.Sprintf("vmtest: %v within %v of the boot (a hung boot): booting again", errSilent, o.SilentLimit)
		if o.Console != nil {
			o.Console(note)
		}
		again, err := boot(ctx, o)
		return out + note + "\n" + again, err
	}
	return out, err
}

// boot is one run of QEMU.
func boot(ctx context.Context, o BootOptions) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	cmd := qemuCommand(ctx, QEMU,
		"-accel", "tcg",
		"-cpu", "max",
		"-smp", "2",
		"-m", fmt.Sprint(o.MemoryMB),
		"-nic", "none",
		"-nographic",
		"-no-reboot",
		"-kernel", o.Kernel,
		"-initrd", o.Initrd,
		"-append", strings.TrimSpace("console=ttyS0 panic=-1 "+o.Append),
	)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	cmd.Stderr = cmd.Stdout
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("starting %s: %w", QEMU, err)
	}
	var mu sync.Mutex
	var out strings.Builder
	done := make(chan struct{})
	spoke := make(chan struct{})
	var silent atomic.Bool
	if o.SilentLimit < o.Timeout {
		watchdog := time.AfterFunc(o.SilentLimit, func() {
			select {
			case <-spoke:
			default:
				silent.Store(true)
				_ = cmd.Process.Kill()
			}
		})
		defer watchdog.Stop()
	}
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		once := sync.Once{}
		for sc.Scan() {
			line := strings.TrimRight(sc.Text(), "\r")
			if strings.Contains(line, "VMTEST ") {
				once.Do(func() { close(spoke) })
			}
			mu.Lock()
			out.WriteString(line + "\n")
			mu.Unlock()
			if o.Console != nil {
				o.Console(line)
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	<-done
	err = cmd.Wait()
	mu.Lock()
	defer mu.Unlock()
	if silent.Load() {
		return out.String(), errSilent
	}
	if ctx.Err() != nil {
		return out.String(), fmt.Errorf("the VM did not finish within %v", o.Timeout)
	}
	if err != nil {
		return out.String(), fmt.Errorf("%s: %w", QEMU, err)
	}
	return out.String(), nil
}

// Results are what the guest reported.
type Results struct {
	Pass  []string // names of passed checks
	Fail  []string // "name: why"
	Notes []string
	Done  bool // the guest got to its end
}

// Console line prefixes the guest prints.
const (
	PrefixPass = "VMTEST PASS "
	PrefixFail = "VMTEST FAIL "
	PrefixNote = "VMTEST NOTE "
	LineDone   = "VMTEST DONE"
)

// ParseResults reads the guest's report from console output. Kernel
// messages interleaved with it are ignored.
func ParseResults(console string) Results {
	var r Results
	for line := range strings.Lines(console) {
		line = strings.TrimSpace(line)
		// The kernel may print on the same line; find the marker.
		i := strings.Index(line, "VMTEST ")
		if i < 0 {
			continue
		}
		line = line[i:]
		switch {
		case strings.HasPrefix(line, PrefixPass):
			r.Pass = append(r.Pass, strings.TrimPrefix(line, PrefixPass))
		case strings.HasPrefix(line, PrefixFail):
			r.Fail = append(r.Fail, strings.TrimPrefix(line, PrefixFail))
		case strings.HasPrefix(line, PrefixNote):
			r.Notes = append(r.Notes, strings.TrimPrefix(line, PrefixNote))
		case strings.HasPrefix(line, LineDone):
			r.Done = true
		}
	}
	return r
}
