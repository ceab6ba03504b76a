package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/internal/vmtest"
)

var (
	soakVMConns = flag.Int("soakvm-conns", 10000, "connections TestPrivilegedSoakInVM holds open through svcproxy")
	soakVMChurn = flag.Duration("soakvm-churn", 20*time.Second, "how long TestPrivilegedSoakInVM churns connections beside the held ones")
	soakVMArgs  = flag.String("soakvm-guest-args", "", "more flags for TestPrivilegedSoakInVM's guest (see internal/e2e/soakguest), e.g. \"-rounds=3 -rss-hold=3m\"")
	soakVMLimit = flag.Duration("soakvm-timeout", 0, "how long TestPrivilegedSoakInVM's VM may run; zero: 8m + the churn + 20ms per connection")
)

// TestPrivilegedSoakInVM is TestPrivilegedSoak at full scale where this
// host's file limit forbids it: a stock Debian cloud kernel under QEMU
// (TCG, 2 CPUs, 2 GiB), the guest program (soakguest) as /init with every
// capability, so it raises RLIMIT_NOFILE as far as it likes. The guest
// runs the real svcproxy binary (built static, no -race) in front of
// backends of its own on loopback addresses, holds -soakvm-conns
// connections open through it while others churn for -soakvm-churn,
// closes them, and checks that svcproxy's file descriptors, goroutines and
// RSS come back to baseline and RSS stays back. -soakvm-guest-args passes
// more guest flags (see internal/e2e/soakguest), e.g. "-rounds=3" or
// "-rss-hold=3m". It needs qemu-system-x86_64 and a kernel package from
// apt (cached outside the repository, see vmtest.CacheDir), skips without
// them, and needs no root and no kernel modules.
func TestPrivilegedSoakInVM(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM and soaks svcproxy for minutes; skipped with -short")
	}
	if err := vmtest.HaveQEMU(); err != nil {
		t.Skipf("%v: skipping the soak VM test (apt-get install qemu-system-x86 to run it)", err)
	}
	// Under TCG on 2 cores 10,000 connections open in 20-70 s on a quiet
	// host and took up to 4.5 min with other work beside; the rest is boot
	// (5 s), the churn, closing (10-60 s), RSS coming back and holding
	// (~1 min) and shutdown. A quiet run takes about 2 minutes.
	vmTimeout := *soakVMLimit
	if vmTimeout == 0 {
		vmTimeout = 8*time.Minute + *soakVMChurn + time.Duration(*soakVMConns)*20*time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout+5*time.Minute)
	defer cancel()
	start := time.Now()
	k, err := vmtest.FetchKernel(ctx, vmtest.CacheDir(), t.Logf)
	if errors.Is(err, vmtest.ErrNoKernel) {
		t.Skipf("skipping the soak VM test: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	fetched := time.Since(start)

	dir := t.TempDir()
	initBin := filepath.Join(dir, "init")
	proxyBin := filepath.Join(dir, "svcproxy")
	for _, b := range []struct{ out, pkg string }{
		{initBin, "github.com/svcproxy/svcproxy/internal/e2e/soakguest"},
		{proxyBin, "github.com/svcproxy/svcproxy/cmd/svcproxy"}, // no -race: RSS is measured
	} {
		if err := vmtest.BuildStatic(ctx, b.out, b.pkg); err != nil {
			t.Fatal(err)
		}
	}
	img := vmtest.NewInitramfs()
	img.AddFileFrom("/init", initBin, 0o755)
	img.AddFileFrom("/svcproxy", proxyBin, 0o755)
	initrd := filepath.Join(dir, "initrd")
	size, err := img.WriteFile(initrd)
	if err != nil {
		t.Fatalf("writing the initramfs: %v", err)
	}
	t.Logf("kernel %s, initramfs %.1f MB; fetch %v, build %v", k.Package, float64(size)/1e6,
		fetched.Round(time.Millisecond), (time.Since(start) - fetched).Round(time.Millisecond))

	bootStart := time.Now()
	console, err := vmtest.Boot(ctx, vmtest.BootOptions{
		Kernel: k.Vmlinuz,
		Initrd: initrd,
		// What follows "--" the kernel hands to /init as its arguments.
		Append:   fmt.Sprintf("quiet loglevel=3 -- -conns=%d -churn=%v %s", *soakVMConns, *soakVMChurn, *soakVMArgs),
		MemoryMB: 2048, // measured at 10,000 connections: 476 MiB in use (svcproxy 140, kernel slab 190, the guest program 60)
		Timeout:  vmTimeout,
		Console: func(line string) {
			if i := strings.Index(line, "VMTEST"); i >= 0 {
				t.Log(strings.TrimSpace(line[i:]))
			}
		},
	})
	vmtest.Report(t, console, err, bootStart)
}
