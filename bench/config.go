package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Config is one run of the suite. Zero values mean the --quick preset's.
type Config struct {
	Preset   string        // "quick" or "full": named in the results
	Modes    []string      // in run order; nil: every mode (those that cannot run are reported skipped)
	Rounds   int           // interleaved rounds of the data-path tests
	Duration time.Duration // per data-path load test; whole seconds (wrk and iperf3 take seconds)
	// FaultDuration is the fault test's length; one backend is killed a
	// third of the way in.
	FaultDuration time.Duration
	Scales        []int // Service counts of the control-plane tests; empty: none
	Endpoints     int   // endpoints per Service in the control-plane tests
	Changes       int   // endpoint changes timed per scale (median, p99)
	IdleConns     int   // idle connections held open for the RSS test
	Tests         []string
	Out           string // results go to Out/<time>/; "" : no files written
	Svcproxy      string // svcproxy binary; "": go build ./cmd/svcproxy into a temp dir
	Backend       string // svcproxy-backend binary; "": built likewise
	// Loadgen: "auto" (wrk and iperf3 when installed, else built-in) or
	// "builtin" (always the built-in Go generators).
	Loadgen  string
	Note     string // free text for the head of results.md ("HEAD abc123, quiet machine")
	Syscalls bool   // profile syscalls of each proxy (strace) in round 1
	// Perf records a CPU profile of each proxy (perf record -g) during
	// keep-alive, new-connection, 1 MiB and DNS load in round 1, saved as
	// perf-<mode>-<load>.txt with the results.
	Perf bool
	// IPVSVM runs svcproxy-ipvs inside a QEMU VM (this machine's kernel has
	// no IPVS), beside direct and the other svcproxy modes measured in the
	// same VM; its figures are reported apart from the host's (see vm.go).
	IPVSVM   bool
	Progress io.Writer // the live progress line; nil: none
	// Rerender, when set, is a results folder whose results.md and charts
	// are written again from its results.json; nothing is run.
	Rerender string
}

// Test names, in the order a mode runs them.
const (
	testBulk1     = "bulk1"
	testBulk4     = "bulk4"
	testKeepAlive = "keepalive"
	testMiB       = "mib"
	testConnRate  = "connrate"
	testUDP       = "udp"
	testIdle      = "idle"
	testFault     = "fault"
	testControl   = "control"
)

var allTests = []string{testBulk1, testBulk4, testKeepAlive, testMiB, testConnRate, testUDP, testIdle, testFault, testControl}

// Quick is the `make bench` preset: under 3 minutes.
func Quick() Config {
	return Config{
		Preset:        "quick",
		Rounds:        1,
		Duration:      2 * time.Second,
		FaultDuration: 2 * time.Second,
		Scales:        []int{1000},
		Endpoints:     10,
		Changes:       20,
		IdleConns:     10000,
		Tests:         allTests,
		Out:           "results",
		Loadgen:       "auto",
	}
}

// Full is the `make bench-full` preset: about 35 minutes with every mode.
// Five rounds, not three: on this kind of shared 2-core machine one
// round's ratio between two proxies moves ±15 %, and the targets it
// judges are 5–10 % apart.
func Full() Config {
	c := Quick()
	c.Preset = "full"
	c.Rounds = 5
	c.Duration = 3 * time.Second
	c.FaultDuration = 2 * time.Second
	c.Scales = []int{1000, 10000}
	c.Syscalls = true
	return c
}

func (c Config) runs(test string) bool { return slices.Contains(c.Tests, test) }

func parseFlags(args []string) (Config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: bench [--quick|--full] [flags]\n\nsvcproxy's benchmark suite: modes side by side in throwaway network namespaces (run as root).\n\nFlags:\n")
		fs.PrintDefaults()
	}
	quick := fs.Bool("quick", false, "the quick preset (default): 1 round, 2s tests, 1,000 Services, no syscall profile (< 3 min)")
	full := fs.Bool("full", false, "the full preset: 5 rounds, 3s tests, 1,000 and 10,000 Services, syscall profile (about 35 min with every mode)")
	modes := fs.String("modes", "", "comma-separated modes, in run order; empty: all of "+strings.Join(modeNames(), ","))
	rounds := fs.Int("rounds", 0, "interleaved rounds; 0: the preset's")
	duration := fs.Duration("duration", 0, "length of each data-path load test (whole seconds); 0: the preset's")
	fault := fs.Duration("fault-duration", 0, "length of the fault test; 0: the preset's")
	scales := fs.String("services", "", "comma-separated Service counts for the control-plane tests, e.g. 1000,10000; 0: none; empty: the preset's")
	changes := fs.Int("changes", 0, "endpoint changes timed per Service count; 0: the preset's")
	idle := fs.Int("idle-conns", 0, "idle connections for the RSS test; 0: the preset's")
	tests := fs.String("tests", "", "comma-separated tests to run; empty: all of "+strings.Join(allTests, ","))
	out := fs.String("out", "results", "results directory; each run writes a <time>/ folder in it")
	svcproxy := fs.String("svcproxy", "", "svcproxy binary; empty: build ./cmd/svcproxy into a temp dir")
	backend := fs.String("backend", "", "svcproxy-backend binary; empty: build ./cmd/svcproxy-backend into a temp dir")
	loadgen := fs.String("loadgen", "auto", "auto: wrk and iperf3 when installed, else the built-in Go generators; builtin: always the built-in ones")
	syscalls := fs.Bool("syscalls", false, "profile each proxy's syscalls with strace in round 1 (on in --full)")
	noSyscalls := fs.Bool("no-syscalls", false, "skip the strace syscall profile")
	note := fs.String("note", "", "a line of text for the head of results.md, e.g. which svcproxy commit a --svcproxy binary is")
	rerender := fs.String("rerender", "", "write results.md and the charts of this results folder again from its results.json, and run nothing")
	perf := fs.Bool("perf", false, "also record a CPU profile of each proxy with perf (round 1), saved as perf-<mode>-<load>.txt")
	ipvsVM := fs.Bool("ipvs-vm", false, "run svcproxy-ipvs inside a QEMU VM (TCG, a Debian cloud kernel with IPVS) after the host's modes, beside direct and whichever of svcproxy-userspace and svcproxy-iptables --modes names, measured in the same VM: keep-alive, new connections and the control plane (the host's scales, and 10,000 when the guest predicts it fits its time budget); reported apart as emulated CPU, not comparable with the host rows")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *quick && *full {
		return Config{}, fmt.Errorf("--quick and --full: pick one")
	}
	c := Quick()
	if *full {
		c = Full()
	}
	if *modes != "" {
		c.Modes = splitList(*modes)
		for _, m := range c.Modes {
			if modeByName(m) == nil {
				return Config{}, fmt.Errorf("--modes: unknown mode %q (known: %s)", m, strings.Join(modeNames(), ", "))
			}
		}
	}
	if *rounds < 0 {
		return Config{}, fmt.Errorf("--rounds: want 1 or more, got %d", *rounds)
	} else if *rounds > 0 {
		c.Rounds = *rounds
	}
	for _, d := range []struct {
		name string
		in   time.Duration
		out  *time.Duration
	}{{"--duration", *duration, &c.Duration}, {"--fault-duration", *fault, &c.FaultDuration}} {
		switch {
		case d.in < 0 || (d.in > 0 && d.in < time.Second):
			return Config{}, fmt.Errorf("%s: want at least 1s, got %v", d.name, d.in)
		case d.in > 0:
			*d.out = d.in.Round(time.Second)
		}
	}
	if *scales != "" {
		c.Scales = nil
		for _, s := range splitList(*scales) {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 || n > 60000 {
				return Config{}, fmt.Errorf("--services: want counts from 1 to 60000, got %q", s)
			}
			if n > 0 {
				c.Scales = append(c.Scales, n)
			}
		}
	}
	if *changes < 0 {
		return Config{}, fmt.Errorf("--changes: want 1 or more, got %d", *changes)
	} else if *changes > 0 {
		c.Changes = *changes
	}
	if *idle < 0 || *idle > 60000 {
		return Config{}, fmt.Errorf("--idle-conns: want 1 to 60000, got %d", *idle)
	} else if *idle > 0 {
		c.IdleConns = *idle
	}
	if *tests != "" {
		c.Tests = splitList(*tests)
		for _, t := range c.Tests {
			if !slices.Contains(allTests, t) {
				return Config{}, fmt.Errorf("--tests: unknown test %q (known: %s)", t, strings.Join(allTests, ", "))
			}
		}
	}
	if *loadgen != "auto" && *loadgen != "builtin" {
		return Config{}, fmt.Errorf("--loadgen: want auto or builtin, got %q", *loadgen)
	}
	c.Out, c.Svcproxy, c.Backend, c.Loadgen = *out, *svcproxy, *backend, *loadgen
	c.Syscalls = (c.Syscalls || *syscalls) && !*noSyscalls
	c.Perf = *perf
	c.IPVSVM = *ipvsVM
	if c.IPVSVM && c.Modes != nil && !slices.Contains(c.Modes, "svcproxy-ipvs") {
		return Config{}, fmt.Errorf("--ipvs-vm runs svcproxy-ipvs in a VM, but --modes does not name it")
	}
	c.Note = *note
	c.Rerender = *rerender
	return c, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// withDefaults fills the zero fields of c from the quick preset.
func (c Config) withDefaults() Config {
	q := Quick()
	if c.Preset == "" {
		c.Preset = "custom"
	}
	if c.Rounds <= 0 {
		c.Rounds = q.Rounds
	}
	if c.Duration <= 0 {
		c.Duration = q.Duration
	}
	if c.FaultDuration <= 0 {
		c.FaultDuration = q.FaultDuration
	}
	if c.Endpoints <= 0 {
		c.Endpoints = q.Endpoints
	}
	if c.Changes <= 0 {
		c.Changes = q.Changes
	}
	if c.IdleConns <= 0 {
		c.IdleConns = q.IdleConns
	}
	if c.Tests == nil {
		c.Tests = q.Tests
	}
	if c.Loadgen == "" {
		c.Loadgen = "auto"
	}
	if c.Modes == nil {
		c.Modes = modeNames()
	}
	return c
}
