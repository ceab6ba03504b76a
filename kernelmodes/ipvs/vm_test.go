//go:build linux

package ipvs_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/internal/vmtest"
)

// guestModules are the modules the VM test loads (their dependencies are
// found from .modinfo): IPVS and its schedulers, conntrack and ctnetlink,
// iptables-legacy with the matches and targets the rules use, the ipset
// types, dummy and veth, and nf_tables for the firewall.
var guestModules = []string{
	"nf_defrag_ipv4", "nf_defrag_ipv6", "libcrc32c", "nf_conntrack",
	"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_lc", "ip_vs_wlc", "ip_vs_sh", "ip_vs_dh", "ip_vs_mh",
	"nfnetlink", "nf_conntrack_netlink",
	"x_tables", "ip_tables", "iptable_nat", "iptable_filter", "nf_nat", "nf_reject_ipv4", "ipt_REJECT",
	"xt_mark", "xt_MASQUERADE", "xt_addrtype", "xt_conntrack", "xt_tcpudp", "xt_set",
	"ip_set", "ip_set_hash_ip", "ip_set_hash_ipport", "ip_set_hash_ipportip", "ip_set_bitmap_port",
	"dummy", "veth",
	"nf_tables", // package firewall's table (loadBalancerSourceRanges)
}

// TestPrivilegedIPVSInVM runs the Service table against a real kernel with
// IPVS: a stock Debian cloud kernel under QEMU (TCG), the guest program
// (vmtest/guest) as /init. It needs qemu-system-x86_64 and a kernel package
// from apt (cached outside the repository, see vmtest.CacheDir), and skips
// without them. It needs no root.
func TestPrivilegedIPVSInVM(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM; skipped with -short")
	}
	if err := vmtest.HaveQEMU(); err != nil {
		t.Skipf("%v: skipping the IPVS VM test (apt-get install qemu-system-x86 to run it)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	k, err := vmtest.FetchKernel(ctx, vmtest.CacheDir(), t.Logf)
	if errors.Is(err, vmtest.ErrNoKernel) {
		t.Skipf("skipping the IPVS VM test: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	mods, err := k.Modules(guestModules...)
	if err != nil {
		t.Fatalf("resolving modules of %s: %v", k.Package, err)
	}
	fetched := time.Since(start)

	dir := t.TempDir()
	initBin := filepath.Join(dir, "init")
	if err := vmtest.BuildStatic(ctx, initBin, "github.com/svcproxy/svcproxy/kernelmodes/ipvs/vmguest"); err != nil {
		t.Fatal(err)
	}

	img := vmtest.NewInitramfs()
	img.AddFileFrom("/init", initBin, 0o755)
	img.AddModules(mods)
	if err := img.AddIPTablesLegacy(); err != nil {
		t.Logf("no iptables-legacy/ipset for the guest (%v): it uses the fake Rules", err)
	}
	initrd := filepath.Join(dir, "initrd")
	size, err := img.WriteFile(initrd)
	if err != nil {
		t.Fatalf("writing the initramfs: %v", err)
	}
	built := time.Since(start) - fetched
	t.Logf("kernel %s, %d modules, initramfs %.1f MB; fetch %v, build %v", k.Package, len(mods), float64(size)/1e6,
		fetched.Round(time.Millisecond), built.Round(time.Millisecond))

	bootStart := time.Now()
	console, err := vmtest.Boot(ctx, vmtest.BootOptions{
		Kernel:  k.Vmlinuz,
		Initrd:  initrd,
		Append:  "quiet loglevel=3",
		Timeout: 3 * time.Minute,
		Console: func(line string) {
			if i := strings.Index(line, "VMTEST"); i >= 0 {
				t.Log(strings.TrimSpace(line[i:])) // after any escape codes the firmware printed
			}
		},
	})
	vmtest.Report(t, console, err, bootStart)
}
