package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Results is everything one run measured; results.json is it verbatim.
type Results struct {
	Dir         string    `json:"-"`
	Started     time.Time `json:"started"`
	Finished    time.Time `json:"finished"`
	Interrupted bool      `json:"interrupted,omitempty"`
	Settings    Settings  `json:"settings"`
	Machine     Machine   `json:"machine"`
	// Generators names the load generator of each test.
	Generators   map[string]string `json:"generators"`
	HTTPBackend  string            `json:"http_backend"`
	Modes        []*ModeResult     `json:"modes"`
	Samples      `json:"samples"`
	Syscalls     []SyscallProfile `json:"syscalls,omitempty"`
	ControlPlane []CPSample       `json:"control_plane,omitempty"`
	// Loads is the 1-minute load average as each mode's round began: other
	// work on the machine shows up here.
	Loads []LoadSample `json:"loads,omitempty"`
	// Profiles are the --perf CPU profiles saved with the results.
	Profiles []PerfProfile `json:"profiles,omitempty"`
	// VM is svcproxy-ipvs run inside a QEMU VM (--ipvs-vm) with its in-VM
	// baselines: emulated CPU, kept apart from Samples and ControlPlane.
	VM *VMResults `json:"vm,omitempty"`

	mu sync.Mutex
}

// Settings are the run's parameters.
type Settings struct {
	Preset    string  `json:"preset"`
	Note      string  `json:"note,omitempty"`
	Rounds    int     `json:"rounds"`
	DurationS float64 `json:"duration_s"`
	FaultS    float64 `json:"fault_duration_s"`
	Scales    []int   `json:"service_counts"`
	Endpoints int     `json:"endpoints_per_service"`
	Changes   int     `json:"changes"`
	IdleConns int     `json:"idle_conns"`
	// IdleConnsWanted is the idle connections asked for; IdleConns is
	// lower when the open-files limit (FileLimit) could not be raised.
	IdleConnsWanted int      `json:"idle_conns_wanted"`
	FileLimit       uint64   `json:"file_limit"`
	Tests           []string `json:"tests"`
	Loadgen         string   `json:"loadgen"`
}

// ModeResult is what happened to one mode.
type ModeResult struct {
	Name     string   `json:"name"`
	Describe string   `json:"describe"`
	Status   string   `json:"status"` // "ran", "ran in the VM" (--ipvs-vm: figures in Results.VM), "failed" (some round or test failed), "skipped"
	Reason   string   `json:"reason,omitempty"`
	Errors   []string `json:"errors,omitempty"`
	Notes    []string `json:"notes,omitempty"`
}

// PerfProfile is one perf report saved as File.
type PerfProfile struct {
	Mode      string  `json:"mode"`
	Load      string  `json:"load"`
	File      string  `json:"file"`
	KernelPct float64 `json:"kernel_pct"` // share of the samples in the kernel
}

// LoadSample is the load average when a mode's round began.
type LoadSample struct {
	Round int     `json:"round"`
	Mode  string  `json:"mode"`
	Load1 float64 `json:"load1"`
}

// Sample is one measured value.
type Sample struct {
	Round  int     `json:"round"` // 0 for the control plane
	Mode   string  `json:"mode"`
	Test   string  `json:"test"`
	Metric string  `json:"metric"`
	Value  float64 `json:"value"`
	Unit   string  `json:"unit"`
	Tool   string  `json:"tool,omitempty"`
}

// SyscallProfile is strace -c over a proxy's processes during a short load.
type SyscallProfile struct {
	Mode     string           `json:"mode"`
	Load     string           `json:"load"` // "keepalive" or "bulk"
	Requests int64            `json:"requests,omitempty"`
	Bytes    int64            `json:"bytes,omitempty"`
	Calls    map[string]int64 `json:"calls"`
	Total    int64            `json:"total"`
}

// CPSample is one control-plane measurement.
type CPSample struct {
	Mode           string    `json:"mode"`
	Services       int       `json:"services"`
	Endpoints      int       `json:"endpoints"`
	ProgramS       float64   `json:"program_s"`
	ProgramTotalS  float64   `json:"program_total_s"`
	ChangesMs      []float64 `json:"changes_ms"`
	ChangesTotalMs []float64 `json:"changes_total_ms"`
	AddsMs         []float64 `json:"adds_ms,omitempty"`
	AddsTotalMs    []float64 `json:"adds_total_ms,omitempty"`
	Notes          []string  `json:"notes,omitempty"`
	Error          string    `json:"error,omitempty"`
}

func (r *Results) add(s Sample) {
	if math.IsNaN(s.Value) || math.IsInf(s.Value, 0) {
		return
	}
	r.mu.Lock()
	r.Samples = append(r.Samples, s)
	r.mu.Unlock()
}

func (r *Results) mode(name string) *ModeResult {
	for _, m := range r.Modes {
		if m.Name == name {
			return m
		}
	}
	return nil
}

// stat is the median and range of a metric over rounds.
type stat struct {
	Median, Min, Max float64
	N                int
}

func (st stat) ok() bool { return st.N > 0 }

// spread is (max-min)/median: how noisy the rounds were.
func (st stat) spread() float64 {
	if st.N < 2 || st.Median == 0 {
		return 0
	}
	return (st.Max - st.Min) / math.Abs(st.Median)
}

func summarize(v []float64) stat {
	if len(v) == 0 {
		return stat{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return stat{Median: median(s), Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// median of sorted values.
func median(s []float64) float64 {
	n := len(s)
	if n == 0 {
		return math.NaN()
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// percentile of sorted values, nearest rank.
func percentile(s []float64, p float64) float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(len(s)-1, i))]
}

func (r *Results) writeJSON(dir string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "results.json"), append(data, '\n'), 0o644)
}
