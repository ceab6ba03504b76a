package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/svcproxy/svcproxy/bench/internal/vmwire"
	"github.com/svcproxy/svcproxy/internal/vmtest"
)

// --ipvs-vm: this machine's kernel has no IPVS and cannot load modules, so
// svcproxy-ipvs runs inside a QEMU VM (package vmtest: a stock Debian cloud
// kernel under TCG, bench/ipvsguest as /init), beside baselines measured in
// the same VM. Its figures are kept apart from the host's (Results.VM):
// the emulated CPU is tens of times slower, so only ratios inside the VM
// mean anything.

// vmLabel heads every VM figure in results.md and results.json.
const vmLabel = "emulated CPU (QEMU TCG), not comparable with the host rows"

// vmMemoryMiB is the VM's memory: 10,000 Services × 10 endpoints in IPVS,
// the guest's snapshot and an iptables-legacy-restore of the iptables mode's
// 110,000 rules fit.
const vmMemoryMiB = 1024

// vmModules are the modules the guest loads (dependencies are found from
// .modinfo): IPVS, conntrack and ctnetlink, iptables-legacy with every
// match and target svcproxy's modes write, the ipset types, dummy and veth.
var vmModules = []string{
	"nf_defrag_ipv4", "nf_defrag_ipv6", "libcrc32c", "nf_conntrack",
	"ip_vs", "ip_vs_rr",
	"nfnetlink", "nf_conntrack_netlink",
	"x_tables", "ip_tables", "iptable_nat", "iptable_filter", "nf_nat", "nf_reject_ipv4", "ipt_REJECT",
	"xt_mark", "xt_MASQUERADE", "xt_addrtype", "xt_conntrack", "xt_tcpudp", "xt_set", "xt_nat", "xt_statistic",
	"xt_recent", "xt_REDIRECT", "xt_comment", "xt_multiport",
	"ip_set", "ip_set_hash_ip", "ip_set_hash_ipport", "ip_set_hash_ipportip", "ip_set_hash_net", "ip_set_bitmap_port",
	"dummy", "veth",
}

// VMResults is the --ipvs-vm run: svcproxy-ipvs and the baselines measured
// in the same VM.
type VMResults struct {
	Label     string `json:"label"`
	Kernel    string `json:"kernel"` // the Debian package booted
	QEMU      string `json:"qemu"`
	Accel     string `json:"accel"`
	VCPUs     int    `json:"vcpus"`
	MemoryMiB int    `json:"memory_mib"`
	CPUModel  string `json:"cpu_model,omitempty"`
	IPTables  string `json:"iptables,omitempty"`
	LoadGen   string `json:"loadgen,omitempty"`
	Backend   string `json:"http_backend,omitempty"`
	// Settings are what the guest was asked to run.
	Settings vmwire.Config `json:"settings"`
	// WallS is the host's time from starting QEMU to its exit; GuestS the
	// guest's from /init's start to its last result.
	WallS  float64 `json:"wall_s"`
	GuestS float64 `json:"guest_s"`
	// HostLoadStart and HostLoadEnd are the host's load averages when the
	// VM started and ended: the emulated CPU slows with other work.
	HostLoadStart [3]float64 `json:"host_load_start"`
	HostLoadEnd   [3]float64 `json:"host_load_end"`
	// Modes, Samples and ControlPlane are as the host's, measured in the
	// VM: the in-VM baselines have the host modes' names.
	Modes        []*ModeResult `json:"modes"`
	Samples      `json:"samples"`
	ControlPlane []vmwire.Control `json:"control_plane,omitempty"`
	// Failures are the guest's failed checks; Error why the VM run as a
	// whole failed.
	Failures []string `json:"failures,omitempty"`
	Error    string   `json:"error,omitempty"`
	// Console is the file the VM's serial console was saved to.
	Console string `json:"console,omitempty"`
}

// vmConfig is what the guest runs for cfg: svcproxy-ipvs beside direct and
// whichever of svcproxy-userspace and svcproxy-iptables cfg.Modes names;
// the keep-alive, new-connection and control-plane tests cfg asks for.
func vmConfig(cfg Config) (vmwire.Config, error) {
	c := vmwire.Config{
		Modes:     []string{vmwire.ModeDirect},
		Rounds:    cfg.Rounds,
		DurationS: cfg.Duration.Seconds(),
		Conns:     64,
		Endpoints: cfg.Endpoints,
		Changes:   cfg.Changes,
	}
	for _, m := range []string{vmwire.ModeUserspace, vmwire.ModeIPTables} {
		if slices.Contains(cfg.Modes, m) {
			c.Modes = append(c.Modes, m)
		}
	}
	c.Modes = append(c.Modes, vmwire.ModeIPVS)
	for _, t := range []string{testKeepAlive, testConnRate, testControl} {
		if cfg.runs(t) {
			c.Tests = append(c.Tests, t)
		}
	}
	if len(c.Tests) == 0 {
		return c, skipf("--ipvs-vm runs the keepalive, connrate and control tests in the VM, and --tests asks for none of them")
	}
	if cfg.runs(testControl) {
		c.Scales = vmScales(cfg.Scales)
	}
	c.BudgetS = vmBudget(c).Seconds()
	return c, nil
}

// vmScales are the control-plane scales in the VM: the host's, and 10,000
// Services for IPVS at least (the guest skips a scale it predicts would
// overrun its budget).
func vmScales(host []int) []int {
	out := slices.Clone(host)
	if !slices.Contains(out, 10000) {
		out = append(out, 10000)
	}
	slices.Sort(out)
	return out
}

// vmBudget bounds the guest's run: the data path's own length plus set-up,
// and three minutes for the control plane.
func vmBudget(c vmwire.Config) time.Duration {
	perTest := time.Duration(c.DurationS*float64(time.Second)) + 3*time.Second
	tests := 0
	for _, t := range c.Tests {
		if t != testControl {
			tests++
		}
	}
	d := 30*time.Second + time.Duration(c.Rounds*len(c.Modes))*(5*time.Second+time.Duration(tests)*perTest)
	if slices.Contains(c.Tests, testControl) {
		d += 3 * time.Minute
	}
	return d
}

// runVM boots the VM, runs the guest and collects its results. An error
// wrapping errSkip means the VM cannot run here (no QEMU, no kernel).
func runVM(ctx context.Context, e *Env, dir string) (*VMResults, error) {
	wcfg, err := vmConfig(e.Cfg)
	if err != nil {
		return nil, err
	}
	if err := vmtest.HaveQEMU(); err != nil {
		return nil, skipf("%v: apt-get install qemu-system-x86 to run svcproxy-ipvs in a VM", err)
	}
	e.Prog.phase("svcproxy-ipvs in a VM · fetching the kernel")
	k, err := vmtest.FetchKernel(ctx, vmtest.CacheDir(), e.Prog.logf)
	if errors.Is(err, vmtest.ErrNoKernel) {
		return nil, skipf("%v", err)
	}
	if err != nil {
		return nil, err
	}
	vm := &VMResults{Label: vmLabel, Kernel: k.Package, Accel: "tcg", VCPUs: 2, MemoryMiB: vmMemoryMiB, Settings: wcfg}
	if out, err := exec.CommandContext(ctx, vmtest.QEMU, "--version").Output(); err == nil {
		vm.QEMU, _, _ = strings.Cut(strings.TrimSpace(string(out)), "\n")
	}
	e.Prog.phase("svcproxy-ipvs in a VM · building the initramfs")
	initrd, err := vmInitramfs(ctx, e, k, wcfg)
	if err != nil {
		return nil, err
	}
	timeout := time.Duration(wcfg.BudgetS*float64(time.Second)) + 2*time.Minute
	e.Prog.detail(fmt.Sprintf("booting %s (at most %v)", k.Package, timeout.Round(time.Second)))
	start := time.Now()
	vm.HostLoadStart = loadAvg()
	console, bootErr := vmtest.Boot(ctx, vmtest.BootOptions{
		Kernel:   k.Vmlinuz,
		Initrd:   initrd,
		Append:   "quiet loglevel=3",
		MemoryMB: vmMemoryMiB,
		Timeout:  timeout,
		Console: func(line string) {
			i := strings.Index(line, "VMTEST ")
			if i < 0 {
				return
			}
			line = line[i:]
			switch {
			case strings.HasPrefix(line, vmtest.PrefixNote+"step "):
				e.Prog.detail(strings.TrimPrefix(line, vmtest.PrefixNote+"step "))
			case strings.HasPrefix(line, vmtest.PrefixFail):
				e.Prog.logf("in the VM: %s", strings.TrimPrefix(line, vmtest.PrefixFail))
			}
		},
	})
	vm.WallS = time.Since(start).Seconds()
	vm.HostLoadEnd = loadAvg()
	if dir != "" {
		vm.Console = "ipvs-vm-console.txt"
		if err := os.WriteFile(filepath.Join(dir, vm.Console), []byte(console), 0o644); err != nil {
			vm.Console = ""
		}
	}
	vm.fill(console)
	if bootErr != nil {
		vm.Error = bootErr.Error()
	}
	return vm, nil
}

// fill reads the guest's results from its console output.
func (vm *VMResults) fill(console string) {
	res := vmtest.ParseResults(console)
	vm.Failures = res.Fail
	recs, perr := vmwire.Parse(res.Notes)
	modes := map[string]*ModeResult{}
	for _, r := range recs {
		switch {
		case r.Info != nil:
			// The guest prints its info first and again at the end.
			in := r.Info
			vm.CPUModel = firstNonEmpty(in.CPUModel, vm.CPUModel)
			vm.IPTables = firstNonEmpty(in.IPTables, vm.IPTables)
			vm.LoadGen = firstNonEmpty(in.LoadGen, vm.LoadGen)
			vm.Backend = firstNonEmpty(in.HTTPServer, vm.Backend)
			if in.CPUs > 0 {
				vm.VCPUs = in.CPUs
			}
			if in.MemoryMiB > 0 {
				vm.MemoryMiB = in.MemoryMiB
			}
			if in.GuestS > 0 {
				vm.GuestS = in.GuestS
			}
		case r.Sample != nil:
			s := r.Sample
			vm.Samples = append(vm.Samples, Sample{Round: s.Round, Mode: s.Mode, Test: s.Test, Metric: s.Metric, Value: s.Value, Unit: s.Unit, Tool: s.Tool})
		case r.Control != nil:
			vm.ControlPlane = append(vm.ControlPlane, *r.Control)
		case r.Mode != nil:
			m := r.Mode
			mr := &ModeResult{Name: m.Name, Describe: m.Describe, Status: m.Status, Reason: m.Reason, Errors: m.Errors, Notes: m.Notes}
			if modes[m.Name] == nil {
				vm.Modes = append(vm.Modes, mr)
			} else {
				*modes[m.Name] = *mr
			}
			modes[m.Name] = mr
		}
	}
	var errs []string
	if perr != nil {
		errs = append(errs, perr.Error())
	}
	if !res.Done {
		errs = append(errs, "the guest did not finish (see the console)")
	}
	for _, name := range vm.Settings.Modes {
		if modes[name] == nil {
			vm.Modes = append(vm.Modes, &ModeResult{Name: name, Status: "failed", Errors: []string{"the guest reported nothing on it"}})
		}
	}
	vm.Error = strings.Join(errs, "; ")
}

// vmInitramfs writes the initramfs: the guest as /init, its settings, the
// modules, iptables-legacy and ipset with their libraries.
func vmInitramfs(ctx context.Context, e *Env, k *vmtest.Kernel, wcfg vmwire.Config) (string, error) {
	mods, err := k.Modules(vmModules...)
	if err != nil {
		return "", fmt.Errorf("resolving the modules of %s: %w", k.Package, err)
	}
	initBin := filepath.Join(e.Scratch, "ipvsguest")
	if err := vmtest.BuildStatic(ctx, initBin, "github.com/svcproxy/svcproxy/bench/ipvsguest"); err != nil {
		return "", fmt.Errorf("building the VM guest (run from inside the svcproxy module): %w", err)
	}
	cfgJSON, err := json.Marshal(wcfg)
	if err != nil {
		return "", err
	}
	img := vmtest.NewInitramfs()
	img.AddFileFrom("/init", initBin, 0o755)
	img.AddFile(vmwire.ConfigPath, cfgJSON, 0o644)
	img.AddModules(mods)
	if err := img.AddIPTablesLegacy(); err != nil {
		return "", fmt.Errorf("copying iptables-legacy and ipset into the initramfs (install iptables and ipset): %w", err)
	}
	initrd := filepath.Join(e.Scratch, "ipvs-vm.initrd")
	_, err = img.WriteFile(initrd)
	return initrd, err
}

// statusVM is svcproxy-ipvs's status when it ran in the VM.
const statusVM = "ran in the VM"

const vmDescribe = "svcproxy's IPVS mode, run inside a QEMU VM (--ipvs-vm; this kernel has no IPVS): its figures are under *svcproxy-ipvs in a QEMU VM*, " + vmLabel

// errors are what went wrong in the VM, each naming the in-VM mode.
func (vm *VMResults) errors() []string {
	var out []string
	if vm.Error != "" {
		out = append(out, "the VM: "+vm.Error)
	}
	for _, m := range vm.Modes {
		for _, e := range m.Errors {
			out = append(out, fmt.Sprintf("in the VM, %s: %s", m.Name, e))
		}
		if m.Status == "failed" && len(m.Errors) == 0 {
			out = append(out, fmt.Sprintf("in the VM, %s failed", m.Name))
		}
	}
	return out
}
