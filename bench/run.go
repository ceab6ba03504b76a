package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/svcproxy/svcproxy/bench/internal/vmwire"
	"github.com/svcproxy/svcproxy/internal/topology"
)

// Run runs the suite. It returns the results (also when interrupted, with
// what was measured so far) and an error when a mode that should have run
// failed, or the run could not start.
func Run(ctx context.Context, cfg Config) (*Results, error) {
	cfg = cfg.withDefaults()
	if err := preflight(); err != nil {
		return nil, err
	}
	prog := newProgress(cfg.Progress)
	defer prog.close()

	scratch, err := os.MkdirTemp("", "svcproxy-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(scratch)
	if err := topology.Cleanup(namespacePrefix); err != nil {
		prog.logf("removing a crashed run's namespaces: %v", err)
	}
	fdLimit, err := raiseFileLimit(1 << 18)
	if err != nil {
		return nil, err
	}
	// A proxy holds two descriptors per idle connection, under the same
	// per-process limit; where root cannot raise it (no CAP_SYS_RESOURCE),
	// open as many as fit and say so.
	idleWanted := cfg.IdleConns
	if fit := (int(fdLimit) - 1500) / 2; cfg.IdleConns > fit {
		cfg.IdleConns = fit
		prog.logf("open-files limit %d (not raisable here): the idle test opens %d connections, not %d", fdLimit, fit, idleWanted)
	}
	e := &Env{Cfg: cfg, Svcproxy: cfg.Svcproxy, Backend: cfg.Backend, Scratch: scratch, Prog: prog, FileLimit: fdLimit, IdleWanted: idleWanted}
	e.Tools = findTools(ctx)
	res := &Results{
		Started: time.Now(),
		Settings: Settings{
			Preset: cfg.Preset, Note: cfg.Note, Rounds: cfg.Rounds, DurationS: cfg.Duration.Seconds(), FaultS: cfg.FaultDuration.Seconds(),
			Scales: cfg.Scales, Endpoints: cfg.Endpoints, Changes: cfg.Changes, IdleConns: cfg.IdleConns, IdleConnsWanted: idleWanted, FileLimit: fdLimit,
			Tests: cfg.Tests, Loadgen: cfg.Loadgen,
		},
		Machine:     describeMachine(e),
		HTTPBackend: e.httpBackend(),
		Generators:  generators(e),
	}
	if cfg.Out != "" {
		res.Dir = filepath.Join(cfg.Out, res.Started.UTC().Format("2006-01-02T15-04-05Z"))
		if err := os.MkdirAll(res.Dir, 0o755); err != nil {
			return nil, err
		}
	}
	if err := buildBinaries(ctx, e); err != nil {
		return res, err
	}
	res.Machine.Svcproxy = svcproxyVersion(cfg.Svcproxy, e.Svcproxy)

	var runnable []Mode
	inVM := false // svcproxy-ipvs runs in the QEMU VM, after the host's modes
	for _, name := range cfg.Modes {
		m := modeByName(name)
		if m == nil {
			return res, fmt.Errorf("unknown mode %q", name)
		}
		mr := &ModeResult{Name: name, Describe: m.Describe(), Status: "ran"}
		res.Modes = append(res.Modes, mr)
		if name == vmwire.ModeIPVS && cfg.IPVSVM {
			inVM = true
			mr.Status, mr.Describe = statusVM, vmDescribe
			continue
		}
		if err := m.Available(e); err != nil {
			mr.Status, mr.Reason = "skipped", skipReason(err)
			prog.logf("%s: skipped: %s", name, mr.Reason)
			continue
		}
		runnable = append(runnable, m)
	}

	// Plan the steps for the progress line.
	steps := 0
	perRound := 1 // set-up
	for _, t := range allTests {
		if t != testControl && cfg.runs(t) {
			perRound++
		}
	}
	steps += cfg.Rounds * len(runnable) * perRound
	for _, m := range runnable { // round 1 profiles the proxies (modes with a process)
		if kernelDataPath(m) {
			continue
		}
		if cfg.Syscalls && e.Tools.Strace != "" {
			steps++
		}
		if cfg.Perf && e.Tools.Perf != "" {
			steps++
		}
	}
	if cfg.runs(testControl) {
		for _, m := range runnable {
			if _, ok := controlPlaneOf(m); ok {
				steps += len(cfg.Scales)
			}
		}
	}
	if inVM {
		steps++
	}
	prog.plan(steps)

	// Data path: A B C, A B C, …
	skipped := map[string]bool{}
	skip := func(name string, err error, round int) {
		prog.unplan((cfg.Rounds - round + 1) * perRound) // roughly: its remaining data-path steps
		mr := res.mode(name)
		mr.Status, mr.Reason = "skipped", skipReason(err)
		skipped[name] = true
		prog.logf("%s: skipped: %s", name, mr.Reason)
	}
	for round := 1; round <= cfg.Rounds && ctx.Err() == nil; round++ {
		for _, m := range runnable {
			name := m.Name()
			if ctx.Err() != nil || skipped[name] {
				continue
			}
			errs := runRound(ctx, e, res, m, round, func(s string) {
				prog.step(fmt.Sprintf("round %d/%d · %s · %s", round, cfg.Rounds, name, s))
			})
			if len(errs) == 1 && errors.Is(errs[0], errSkip) {
				skip(name, errs[0], round)
				continue
			}
			for _, err := range errs {
				if ctx.Err() != nil {
					break // interrupted: what failed is the interruption's doing
				}
				mr := res.mode(name)
				mr.Status = "failed"
				mr.Errors = append(mr.Errors, fmt.Sprintf("round %d: %v", round, err))
				prog.logf("%s, round %d: %v", name, round, err)
			}
		}
	}

	// Control plane: each mode that programs Services, each scale, once.
	if cfg.runs(testControl) {
		for _, scale := range cfg.Scales {
			for _, m := range runnable {
				cp, ok := controlPlaneOf(m)
				if !ok || ctx.Err() != nil || skipped[m.Name()] {
					continue
				}
				prog.step(fmt.Sprintf("control plane · %s · %s Services × %d endpoints", m.Name(), fmtCount(scale), cfg.Endpoints))
				s, err := runControlPlane(ctx, e, m.Name(), cp, scale)
				if errors.Is(err, errSkip) {
					skip(m.Name(), err, cfg.Rounds+1)
					continue
				}
				res.ControlPlane = append(res.ControlPlane, s)
				if s.Error != "" && ctx.Err() == nil {
					mr := res.mode(m.Name())
					mr.Status = "failed"
					mr.Errors = append(mr.Errors, fmt.Sprintf("control plane, %d Services: %s", scale, s.Error))
					prog.logf("%s, control plane at %d Services: %s", m.Name(), scale, s.Error)
				}
			}
		}
	}

	// svcproxy-ipvs in the VM, alone on the machine: the VM takes both cores.
	if inVM && ctx.Err() == nil {
		prog.step("svcproxy-ipvs in a QEMU VM")
		vm, err := runVM(ctx, e, res.Dir)
		res.VM = vm
		mr := res.mode(vmwire.ModeIPVS)
		switch {
		case errors.Is(err, errSkip):
			mr.Status, mr.Reason = "skipped", skipReason(err)
			prog.logf("%s: skipped: %s", mr.Name, mr.Reason)
		case err != nil:
			mr.Status = "failed"
			mr.Errors = append(mr.Errors, "in the VM: "+err.Error())
			prog.logf("%s: %v", mr.Name, err)
		default:
			if errs := vm.errors(); len(errs) > 0 && ctx.Err() == nil {
				mr.Status, mr.Errors = "failed", append(mr.Errors, errs...)
				prog.logf("%s: %s", mr.Name, strings.Join(errs, "; "))
			}
		}
	}

	res.Finished = time.Now()
	res.Machine.LoadEnd = loadAvg()
	res.Interrupted = ctx.Err() != nil
	prog.phase("writing results")
	if res.Dir != "" {
		if err := writeResults(res); err != nil {
			return res, fmt.Errorf("writing results: %w", err)
		}
	}
	if ctx.Err() != nil {
		return res, fmt.Errorf("interrupted: %w", ctx.Err())
	}
	var failed []string
	for _, m := range res.Modes {
		if m.Status == "failed" {
			failed = append(failed, m.Name)
		}
	}
	if len(failed) > 0 {
		return res, fmt.Errorf("modes failed: %v (see results.md)", failed)
	}
	return res, nil
}

// generators names the load generator each test uses on this machine.
func generators(e *Env) map[string]string {
	httpTool, bulkTool := toolBuiltinHTTP, toolBuiltinBulk
	if e.useWrk() {
		httpTool = toolWrk
	}
	if e.useIperf() {
		bulkTool = toolIperf
	}
	return map[string]string{
		testBulk1: bulkTool, testBulk4: bulkTool, testKeepAlive: httpTool, testMiB: httpTool, testConnRate: httpTool,
		testIdle: "built-in Go dialer", testFault: "built-in Go client (always)",
	}
}

// runControlPlane runs one control-plane measurement on a fresh node. A
// failure is reported in the sample; only a skip is returned as an error.
func runControlPlane(ctx context.Context, e *Env, mode string, cp ControlPlane, scale int) (CPSample, error) {
	s := CPSample{Mode: mode, Services: scale}
	c, err := nodeOnly(e, fmt.Sprintf("cp-%s-%d", mode, scale))
	if err != nil {
		s.Error = err.Error()
		return s, nil
	}
	defer c.Close()
	services := genServices(scale, e.Cfg.Endpoints)
	changes := append(genChanges(services, e.Cfg.Changes), genAdds(services, e.Cfg.Changes)...)
	r, err := cp.ProgramServices(ctx, e, c, services, changes)
	if errors.Is(err, errSkip) {
		return s, err
	}
	if err != nil {
		s.Error = err.Error()
		return s, nil
	}
	s.Endpoints = r.Endpoints
	s.ProgramS, s.ProgramTotalS = r.Program.Seconds(), r.ProgramTotal.Seconds()
	for i := range r.Changes {
		s.ChangesMs = append(s.ChangesMs, ms(r.Changes[i]))
		s.ChangesTotalMs = append(s.ChangesTotalMs, ms(r.ChangesTotal[i]))
	}
	for i := range r.Adds {
		s.AddsMs = append(s.AddsMs, ms(r.Adds[i]))
		s.AddsTotalMs = append(s.AddsTotalMs, ms(r.AddsTotal[i]))
	}
	s.Notes = r.Notes
	return s, nil
}

// genServices makes n Service ports (up to 65,280), each a ClusterIP in
// 198.19.1.0–198.19.255.255 on port 80, clear of the data-path Services in
// 198.19.0.0/24 (a services file with both is valid), with eps endpoints in
// 198.18.64.0/18 (addresses no host has: the control-plane tests send no
// traffic).
func genServices(n, eps int) []SvcPort {
	base := topology.FreeRange.Addr().As4()
	vip0 := uint32(base[0])<<24 | uint32(base[1])<<16 | 1<<8
	ep0 := uint32(198)<<24 | uint32(18)<<16 | uint32(64)<<8
	out := make([]SvcPort, n)
	for i := range out {
		s := SvcPort{Namespace: "scale", Service: fmt.Sprintf("svc-%05d", i), PortName: "http", VIP: addr4(vip0 + uint32(i)), Port: 80}
		for j := range eps {
			k := uint32(i*eps+j) % 16000
			s.Endpoints = append(s.Endpoints, netip.AddrPortFrom(addr4(ep0+k+1), 8080))
		}
		out[i] = s
	}
	return out
}

// genChanges picks n endpoint changes spread over the Services, each
// replacing an endpoint with a new address in 198.18.128.0/17; applied in
// order they are consistent.
func genChanges(services []SvcPort, n int) []EndpointChange {
	if len(services) == 0 {
		return nil
	}
	cur := make([][]netip.AddrPort, len(services))
	for i, s := range services {
		cur[i] = slices.Clone(s.Endpoints)
	}
	new0 := uint32(198)<<24 | uint32(18)<<16 | uint32(128)<<8
	var out []EndpointChange
	for m := range n {
		i := (m*7919 + 13) % len(services)
		j := m % len(cur[i])
		ch := EndpointChange{Service: i, Old: cur[i][j], New: netip.AddrPortFrom(addr4(new0+uint32(m)+1), 8080)}
		cur[i][j] = ch.New
		out = append(out, ch)
	}
	return out
}

// genAdds makes n Service ports to add after services, one at a time, like
// genServices' (the next ClusterIPs), each with as many endpoints as the
// first Service has.
func genAdds(services []SvcPort, n int) []EndpointChange {
	if len(services) == 0 {
		return nil
	}
	more := genServices(len(services)+n, len(services[0].Endpoints))[len(services):]
	out := make([]EndpointChange, n)
	for i := range more {
		more[i].Service = fmt.Sprintf("added-%05d", i)
		out[i] = EndpointChange{Service: len(services) + i, Added: &more[i]}
	}
	return out
}

func addr4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
