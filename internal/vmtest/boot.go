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
}

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
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, QEMU,
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
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := strings.TrimRight(sc.Text(), "\r")
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
