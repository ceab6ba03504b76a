package main

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
)

// Machine describes where the figures came from.
type Machine struct {
	Hostname  string  `json:"hostname"`
	CPU       string  `json:"cpu"`
	Cores     int     `json:"cores"`
	MemoryGiB float64 `json:"memory_gib"`
	Kernel    string  `json:"kernel"`
	OS        string  `json:"os"`
	// TCPCC is the TCP congestion control new namespaces inherit: with a
	// pacing one (bbr) bulk figures differ a lot from cubic's or reno's.
	TCPCC     string            `json:"tcp_congestion_control,omitempty"`
	LoadStart [3]float64        `json:"load_start"`
	LoadEnd   [3]float64        `json:"load_end"`
	Svcproxy  string            `json:"svcproxy"` // which svcproxy ran: the tree it was built from, or the binary given
	Tools     map[string]string `json:"tools"`
}

func describeMachine(e *Env) Machine {
	m := Machine{Cores: runtime.NumCPU(), Tools: e.Tools.Versions, LoadStart: loadAvg()}
	m.Hostname, _ = os.Hostname()
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if kib, err := kibField("/proc/meminfo", "MemTotal:"); err == nil {
		m.MemoryGiB = float64(kib) / (1 << 20)
	}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(data))
	}
	if data, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control"); err == nil {
		m.TCPCC = strings.TrimSpace(string(data))
	}
	if data, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	return m
}

// svcproxyVersion says which svcproxy ran: built by the bench from the
// working tree (git describe), or a binary given with --svcproxy.
func svcproxyVersion(given, path string) string {
	if given == "" {
		if out, err := exec.Command("git", "describe", "--always", "--dirty").Output(); err == nil {
			return "built from the working tree at " + strings.TrimSpace(string(out))
		}
		return "built from the working tree"
	}
	s := "the binary " + given
	if data, err := os.ReadFile(path); err == nil {
		s += fmt.Sprintf(" (sha256 %.12x)", sha256.Sum256(data))
	}
	return s
}

// loadAvg is /proc/loadavg's 1, 5 and 15 minute load averages.
func loadAvg() [3]float64 {
	var l [3]float64
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return l
	}
	f := strings.Fields(string(data))
	for i := 0; i < 3 && i < len(f); i++ {
		l[i], _ = strconv.ParseFloat(f[i], 64)
	}
	return l
}
