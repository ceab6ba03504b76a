package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/svcproxy/svcproxy/internal/topology"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat: 100
// on every Linux architecture Go supports.
const clockTicks = 100

// procStat is the part of /proc/PID/stat the suite reads.
type procStat struct {
	ppid         int
	utime, stime uint64 // clock ticks, every thread of the process
}

// parseStat parses a /proc/PID/stat line; the command name may hold spaces
// and parentheses, so fields are counted from the last ')'.
func parseStat(line string) (procStat, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("no ')' in %q", line)
	}
	f := strings.Fields(line[i+1:])
	// f[0] is field 3 (state); ppid is field 4, utime 14, stime 15.
	if len(f) < 13 {
		return procStat{}, fmt.Errorf("short stat line %q", line)
	}
	var s procStat
	var err error
	if s.ppid, err = strconv.Atoi(f[1]); err != nil {
		return s, err
	}
	if s.utime, err = strconv.ParseUint(f[11], 10, 64); err != nil {
		return s, err
	}
	if s.stime, err = strconv.ParseUint(f[12], 10, 64); err != nil {
		return s, err
	}
	return s, nil
}

func readStat(pid int) (procStat, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	return parseStat(string(data))
}

// cpuSeconds is the user+system CPU time the processes have used.
func cpuSeconds(pids []int) (float64, error) {
	var ticks uint64
	for _, pid := range pids {
		s, err := readStat(pid)
		if err != nil {
			return 0, err
		}
		ticks += s.utime + s.stime
	}
	return float64(ticks) / clockTicks, nil
}

// children lists the processes whose parent is pid.
func children(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, err := readStat(p); err == nil && s.ppid == pid {
			out = append(out, p)
		}
	}
	return out
}

// memory is resident memory in KiB: VmRSS from /proc/PID/status and Pss
// from /proc/PID/smaps_rollup, summed over processes.
type memory struct{ rssKiB, pssKiB uint64 }

func memoryOf(pids []int) (memory, error) {
	var m memory
	for _, pid := range pids {
		rss, err := kibField(fmt.Sprintf("/proc/%d/status", pid), "VmRSS:")
		if err != nil {
			return m, err
		}
		m.rssKiB += rss
		if pss, err := kibField(fmt.Sprintf("/proc/%d/smaps_rollup", pid), "Pss:"); err == nil {
			m.pssKiB += pss
		}
	}
	return m, nil
}

func kibField(path, key string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key); ok {
			v = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB"))
			return strconv.ParseUint(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no %s", path, key)
}

// fdCount is the number of open file descriptors of the processes.
func fdCount(pids []int) int {
	n := 0
	for _, pid := range pids {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err == nil {
			n += len(ents)
		}
	}
	return n
}

// tcpCounters are a namespace's TCP retransmission counters.
type tcpCounters struct {
	RetransSegs int64 // Tcp: RetransSegs (/proc/net/snmp)
	SynRetrans  int64 // TcpExt: TCPSynRetrans (/proc/net/netstat): SYNs sent again
}

func (a tcpCounters) sub(b tcpCounters) tcpCounters {
	return tcpCounters{RetransSegs: a.RetransSegs - b.RetransSegs, SynRetrans: a.SynRetrans - b.SynRetrans}
}

// readTCPCounters reads h's namespace's counters (through
// /proc/thread-self/net, which shows the calling thread's namespace).
func readTCPCounters(h *topology.Host) (tcpCounters, error) {
	var c tcpCounters
	err := h.Do(func() error {
		snmp, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		netstat, err := os.ReadFile("/proc/thread-self/net/netstat")
		if err != nil {
			return err
		}
		if c.RetransSegs, err = snmpValue(string(snmp), "Tcp", "RetransSegs"); err != nil {
			return err
		}
		c.SynRetrans, err = snmpValue(string(netstat), "TcpExt", "TCPSynRetrans")
		return err
	})
	return c, err
}

// snmpValue reads one counter from /proc/net/snmp's or netstat's layout: a
// header line "Proto: name name…" followed by "Proto: value value…".
func snmpValue(text, proto, name string) (int64, error) {
	lines := strings.Split(text, "\n")
	for i := 0; i+1 < len(lines); i++ {
		h, ok := strings.CutPrefix(lines[i], proto+": ")
		if !ok {
			continue
		}
		v, ok := strings.CutPrefix(lines[i+1], proto+": ")
		if !ok {
			continue
		}
		names, vals := strings.Fields(h), strings.Fields(v)
		for j, n := range names {
			if n == name && j < len(vals) {
				return strconv.ParseInt(vals[j], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no %s %s counter", proto, name)
}
