// Package vmwire is what the bench (on the host) and its IPVS guest
// (bench/ipvsguest, the /init of a QEMU VM) exchange: the guest's settings,
// written into the initramfs as JSON at ConfigPath, and its results, printed
// on the serial console one JSON record a line as
//
//	VMTEST NOTE BENCH {"sample":{...}}
//
// (vmtest.PrefixNote, then Tag), so vmtest.ParseResults collects them among
// the guest's other notes and the kernel's messages.
package vmwire

import (
	"encoding/json"
	"fmt"
	"strings"
)

// ConfigPath is where the host puts Config in the initramfs.
const ConfigPath = "/bench/config.json"

// Tag starts a result record in a vmtest note.
const Tag = "BENCH "

// The data-path modes the guest knows, in its default run order.
const (
	ModeDirect    = "direct"
	ModeUserspace = "svcproxy-userspace"
	ModeIPTables  = "svcproxy-iptables"
	ModeIPVS      = "svcproxy-ipvs"
)

// Test names, the bench's.
const (
	TestKeepAlive = "keepalive"
	TestConnRate  = "connrate"
	TestControl   = "control"
)

// Config is what the guest runs.
type Config struct {
	// Modes are the data-path modes, in run order (direct and
	// svcproxy-ipvs always among them); control-plane figures are taken
	// for each of them that programs Services.
	Modes  []string `json:"modes"`
	Rounds int      `json:"rounds"` // interleaved rounds of the data-path tests
	// DurationS is each data-path load test's length, in seconds.
	DurationS float64 `json:"duration_s"`
	// Conns is the keep-alive connections and the new-connection test's
	// concurrency.
	Conns     int      `json:"conns"`
	Tests     []string `json:"tests"`  // of TestKeepAlive, TestConnRate, TestControl
	Scales    []int    `json:"scales"` // Service counts of the control-plane test
	Endpoints int      `json:"endpoints"`
	Changes   int      `json:"changes"` // endpoint changes timed per scale
	// BudgetS bounds the guest's run in seconds: a control-plane scale
	// predicted (from the scale below it) to end past it is skipped.
	BudgetS float64 `json:"budget_s"`
}

// Record is one line of results: exactly one field is set.
type Record struct {
	Info    *Info    `json:"info,omitempty"`
	Mode    *Mode    `json:"mode,omitempty"`
	Sample  *Sample  `json:"sample,omitempty"`
	Control *Control `json:"control,omitempty"`
}

// Info describes the guest.
type Info struct {
	Kernel     string `json:"kernel"`
	CPUs       int    `json:"cpus"`
	MemoryMiB  int    `json:"memory_mib"`
	CPUModel   string `json:"cpu_model"`
	IPTables   string `json:"iptables"` // the iptables the guest's modes use
	LoadGen    string `json:"loadgen"`
	HTTPServer string `json:"http_server"`
	// GuestS is the seconds from /init's start to this record (the last one).
	GuestS float64 `json:"guest_s,omitempty"`
}

// Mode is what became of one mode in the guest.
type Mode struct {
	Name     string   `json:"name"`
	Describe string   `json:"describe"`
	Status   string   `json:"status"` // "ran", "failed", "skipped"
	Reason   string   `json:"reason,omitempty"`
	Errors   []string `json:"errors,omitempty"`
	Notes    []string `json:"notes,omitempty"`
}

// Sample is one measured value, as the bench's results hold it.
type Sample struct {
	Round  int     `json:"round"`
	Mode   string  `json:"mode"`
	Test   string  `json:"test"`
	Metric string  `json:"metric"`
	Value  float64 `json:"value"`
	Unit   string  `json:"unit"`
	Tool   string  `json:"tool,omitempty"`
}

// Control is one control-plane measurement: programming Services ×
// Endpoints from scratch, then one endpoint change at a time.
type Control struct {
	Mode      string `json:"mode"`
	Services  int    `json:"services"`
	Endpoints int    `json:"endpoints"` // in all
	// ProgramS is the mode's Apply of the first snapshot; ProgramTotalS
	// also counts the store building it.
	ProgramS      float64 `json:"program_s"`
	ProgramTotalS float64 `json:"program_total_s"`
	// ChangesMs and ChangesTotalMs are, per change, the mode's Apply and
	// store update plus Apply.
	ChangesMs      []float64 `json:"changes_ms"`
	ChangesTotalMs []float64 `json:"changes_total_ms"`
	Notes          []string  `json:"notes,omitempty"`
	Error          string    `json:"error,omitempty"`
	Skipped        string    `json:"skipped,omitempty"` // why the scale was not run
}

// Line is r as the guest prints it after vmtest's note prefix.
func (r Record) Line() string {
	b, err := json.Marshal(r)
	if err != nil {
		panic(fmt.Sprintf("vmwire: marshalling a record: %v", err)) // plain data: cannot happen
	}
	return Tag + string(b)
}

// Parse reads the records among vmtest notes (vmtest.Results.Notes);
// notes without Tag are not records. A record that does not parse is an
// error naming it; the records before and after it are still returned.
func Parse(notes []string) ([]Record, error) {
	var out []Record
	var errs []string
	for _, n := range notes {
		rest, ok := strings.CutPrefix(strings.TrimSpace(n), Tag)
		if !ok {
			continue
		}
		var r Record
		if err := json.Unmarshal([]byte(rest), &r); err != nil {
			errs = append(errs, fmt.Sprintf("%q: %v", truncate(rest, 80), err))
			continue
		}
		out = append(out, r)
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("unreadable result lines from the VM: %s", strings.Join(errs, "; "))
	}
	return out, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
