package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/svcproxy/svcproxy/bench/internal/vmwire"
)

// The VM's figures in results.md: a section of their own, never in the
// host's tables, ratios or charts.

// ranModes are the in-VM modes with a data-path sample, in run order.
func (vm *VMResults) ranModes() []string { return vm.ran(vm.Settings.Modes) }

// vmColumns are the VM's data-path figures.
var vmColumns = []column{
	{"keep-alive req/s", testKeepAlive, "rps", fk, true},
	{"p50 ms", testKeepAlive, "p50_ms", f1, false},
	{"p99 ms", testKeepAlive, "p99_ms", f1, false},
	{"new conn/s", testConnRate, "conn_per_s", fk, true},
	{"VM CPU µs/request (keep-alive)", testKeepAlive, "vm_cpu_us_per_req", f0, false},
	{"VM CPU µs/connection", testConnRate, "vm_cpu_us_per_conn", f0, false},
}

var vmRatioColumns = []column{
	{"keep-alive req/s", testKeepAlive, "rps", nil, true},
	{"p99 latency", testKeepAlive, "p99_ms", nil, false},
	{"new conn/s", testConnRate, "conn_per_s", nil, true},
	{"VM CPU µs/request", testKeepAlive, "vm_cpu_us_per_req", nil, false},
	{"VM CPU µs/connection", testConnRate, "vm_cpu_us_per_conn", nil, false},
}

// cell is the median, with the range over rounds when there were several.
func (vm *VMResults) cell(mode string, c column) string {
	st := vm.stat(mode, c.test, c.metric)
	if !st.ok() {
		return "–"
	}
	if st.N > 1 {
		return fmt.Sprintf("%s (%s–%s)", c.format(st.Median), c.format(st.Min), c.format(st.Max))
	}
	return c.format(st.Median)
}

// vmSection writes the VM's section of results.md.
func (r *Results) vmSection(b *strings.Builder) {
	vm := r.VM
	if vm == nil {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("## svcproxy-ipvs in a QEMU VM: %s\n\n", vm.Label)
	p("This machine's kernel has no IPVS and cannot load modules, so `--ipvs-vm` ran svcproxy-ipvs inside a VM: Debian's `%s` under %s with **TCG (software emulation of the CPU, no KVM)**, %d vCPUs on the host's %d cores, %d MiB. ",
		vm.Kernel, firstNonEmpty(vm.QEMU, "QEMU"), vm.VCPUs, r.Machine.Cores, vm.MemoryMiB)
	p("Everything in this section ran on the emulated CPU, tens of times slower than the host's and slowed further by whatever else the host runs (host load average %.2f when the VM started, %.2f when it ended): **no figure here compares with the tables above; compare the rows of this section with each other**, measured in the same VM in the same run. ",
		vm.HostLoadStart[0], vm.HostLoadEnd[0])
	p("The modes are svcproxy's own packages driven in the guest from an `lb.Store` (not the svcproxy binary: no sync runner, no services file), with %s; the load generator (%s) and the backends (%s) run on the same 2 vCPUs. ",
		firstNonEmpty(vm.IPTables, "iptables-legacy"), firstNonEmpty(vm.LoadGen, "the guest's Go client"), firstNonEmpty(vm.Backend, "the guest's Go server"))
	p("Each (round, mode) gets fresh pod and backend namespaces and starts with an empty conntrack table in the node (which tracks connections only while a mode's rules or IPVS need it: not for direct). The VM ran %.0f s (the guest %.0f s).", vm.WallS, vm.GuestS)
	if vm.Console != "" {
		p(" Its console is saved as [%s](%s).", vm.Console, vm.Console)
	}
	p("\n\n")
	if vm.Error != "" {
		p("**The VM run failed: %s.**\n\n", strings.TrimSuffix(vm.Error, "."))
	}
	for _, f := range vm.Failures {
		p("- failed in the VM: %s\n", f)
	}
	if len(vm.Failures) > 0 {
		p("\n")
	}

	ran := vm.ranModes()
	if len(ran) > 0 {
		p("### Data path in the VM (%s)\n\n", vm.Label)
		p("| mode, in the VM |")
		for _, c := range vmColumns {
			p(" %s |", c.head)
		}
		p(" SYN retransmits (client / node) |\n|---|%s---:|\n", strings.Repeat("---:|", len(vmColumns)))
		for _, m := range ran {
			name := m
			if m == vmwire.ModeIPVS {
				name = "**" + m + "**"
			}
			p("| %s (VM) |", name)
			for _, c := range vmColumns {
				p(" %s |", vm.cell(m, c))
			}
			rtx := "–"
			if st := vm.stat(m, testConnRate, "syn_retrans_client"); st.ok() {
				rtx = fmt.Sprintf("%s / %s", fInt(st.Median), fInt(vm.med(m, testConnRate, "syn_retrans_node")))
			}
			p(" %s |\n", rtx)
		}
		p("\nMedians of %d round(s) of %gs tests (min–max in brackets when more than one); keep-alive: 1 KiB responses over %d connections, one request in flight on each; new conn/s: one request per connection, %d at a time, the server closing first. *VM CPU*: busy time of all the VM's vCPUs (/proc/stat) per request or connection: load generator, backends and data path together, so the difference between two rows is what the data path costs.\n\n",
			vm.Settings.Rounds, vm.Settings.DurationS, vm.Settings.Conns, vm.Settings.Conns)
		for _, base := range []string{vmwire.ModeDirect, vmwire.ModeIPTables} {
			if !slices.Contains(ran, base) {
				continue
			}
			p("Against **%s (VM)**, same VM (p99 latency and CPU: lower is better, so below 1× is better):\n\n| mode, in the VM |", base)
			for _, c := range vmRatioColumns {
				p(" %s |", c.head)
			}
			p("\n|---|%s\n", strings.Repeat("---:|", len(vmRatioColumns)))
			for _, m := range ran {
				if m == base {
					continue
				}
				p("| %s (VM) |", m)
				for _, c := range vmRatioColumns {
					p(" %s |", fmtRatio(vm.ratio(m, base, c)))
				}
				p("\n")
			}
			p("\n")
		}
	}

	if len(vm.ControlPlane) > 0 {
		p("### Control plane in the VM (%s)\n\n", vm.Label)
		p("Program N Services × %d endpoints from scratch with a fresh instance of the mode, then %d endpoint changes one at a time. *program*: the mode's Apply of the first snapshot (*incl. store*: also `lb.Store.Replace` building it); *change*: the mode's Apply of the changed snapshot (*incl. store*: also `lb.Store.Update` of the one Service). A scale the guest predicted (from the smaller one) would overrun its time budget of %.0f s is skipped.\n\n",
			vm.Settings.Endpoints, vm.Settings.Changes, vm.Settings.BudgetS)
		p("| mode, in the VM | Services × endpoints | program s | program incl. store s | change p50 ms | change p99 ms | change p50 ms incl. store | change p99 ms incl. store | changes |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, s := range vm.ControlPlane {
			scale := fmt.Sprintf("%s × %d", fmtCount(s.Services), s.Endpoints/max(1, s.Services))
			switch {
			case s.Skipped != "":
				p("| %s (VM) | %s | skipped: %s | | | | | | |\n", s.Mode, scale, strings.ReplaceAll(s.Skipped, "|", "/"))
				continue
			case s.Error != "" && len(s.ChangesMs) == 0:
				p("| %s (VM) | %s | failed: %s | | | | | | |\n", s.Mode, scale, strings.ReplaceAll(firstLine(s.Error), "|", "/"))
				continue
			}
			own, tot := slices.Sorted(slices.Values(s.ChangesMs)), slices.Sorted(slices.Values(s.ChangesTotalMs))
			name := s.Mode
			if s.Mode == vmwire.ModeIPVS {
				name = "**" + s.Mode + "**"
			}
			p("| %s (VM) | %s | %s | %s | %s | %s | %s | %s | %d |\n", name, scale, fmtNum(s.ProgramS), fmtNum(s.ProgramTotalS),
				fmtOr(median(own), fmtNum, ""), fmtOr(percentile(own, 99), fmtNum, ""), fmtOr(median(tot), fmtNum, ""), fmtOr(percentile(tot, 99), fmtNum, ""), len(own))
		}
		p("\n")
		for _, s := range vm.ControlPlane {
			for _, n := range s.Notes {
				p("- %s (VM), %s Services: %s.\n", s.Mode, fmtCount(s.Services), strings.TrimSuffix(n, "."))
			}
			if s.Error != "" && len(s.ChangesMs) > 0 {
				p("- %s (VM), %s Services: **failed**: %s.\n", s.Mode, fmtCount(s.Services), strings.TrimSuffix(firstLine(s.Error), "."))
			}
		}
		p("\n")
	}

	p("Modes in the VM:\n\n")
	for _, m := range vm.Modes {
		status := ""
		switch m.Status {
		case "failed":
			status = " **FAILED**"
		case "skipped":
			status = " skipped: " + m.Reason
		}
		p("- **%s** (VM)%s: %s.", m.Name, status, strings.TrimSuffix(firstNonEmpty(m.Describe, "–"), "."))
		for _, n := range uniq(m.Notes) {
			p(" %s.", strings.TrimSuffix(n, "."))
		}
		p("\n")
		for _, e := range m.Errors {
			p("  - error: %s\n", strings.ReplaceAll(e, "\n", " "))
		}
	}
	p("\n")
}

// vmCaveat is the comparability line for the VM's figures.
func (r *Results) vmCaveat() string {
	if r.VM == nil {
		return ""
	}
	return "svcproxy-ipvs ran in a QEMU VM with an emulated CPU (TCG): its figures, and those of the baselines measured beside it in the VM, are in their own section and never in the host's tables, ratios or charts. Inside the VM the modes are svcproxy's packages driven by the guest program (no svcproxy binary), with iptables-legacy; the load generator and the backends share the VM's 2 vCPUs with them (svcproxy-userspace's forwarder even shares the guest's Go runtime), so ratios between the VM's rows are indicative, its absolute figures meaningless outside it."
}
