package main

import (
	"os"
	"runtime"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/proxymode"
	"github.com/svcproxy/svcproxy/sysctl"
)

// tune sets the kernel parameters kube-proxy sets at start: its conntrack
// section (conntrack.Tune), in every mode but the userspace mode with
// --steering=none (svcproxy on loopback or a static file, no node's
// traffic through its NAT) unless --init-only asks, and, for --init-only,
// the IPVS mode's
// parameters when --proxy-mode=ipvs. What it cannot set it names in a
// warning and goes on: in a container that is not privileged /proc/sys is
// read-only, and the DaemonSet's privileged init container (svcproxy
// --init-only) is what sets them.
func tune(o *options, log *zap.Logger) {
	if runtime.GOOS != "linux" {
		return
	}
	kernelMode := o.proxyMode == proxymode.IPTables || o.proxyMode == proxymode.IPVS || o.proxyMode == proxymode.NFTables
	if o.steering == "none" && !kernelMode && !o.initOnly {
		log.Debug("leaving connection tracking as it is: --steering=none uses no NAT")
	} else {
		changed, failed := conntrack.Tune(o.conntrack, nodeCPUs(), sysctl.Files{}, sysctl.Module)
		for _, c := range changed {
			log.Info("set a connection-tracking parameter (kube-proxy's conntrack section)", zap.String("parameter", c))
		}
		why := "run svcproxy --init-only with the privilege to write /proc/sys (the DaemonSet's init container does), or set it on the node"
		if o.initOnly {
			why = "/proc/sys must be writable (a privileged container), and the table's size is the node's first network namespace's"
		}
		for _, e := range failed {
			log.Warn("cannot set a connection-tracking parameter as kube-proxy's conntrack section asks: "+why, zap.Error(e))
		}
	}
	if o.initOnly && o.proxyMode == proxymode.IPVS {
		if err := ipvs.EnsureSysctls(sysctl.Files{}); err != nil {
			log.Warn("cannot set the IPVS mode's parameters", zap.Error(err))
		}
	}
}

// nodeCPUs counts the node's online CPUs, which kube-proxy sizes the
// table by, from /sys/devices/system/cpu/online: runtime.NumCPU counts
// only those the process may run on, fewer in a container with a CPU set.
func nodeCPUs() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return runtime.NumCPU()
	}
	if n := countCPUList(string(b)); n > 0 {
		return n
	}
	return runtime.NumCPU()
}

// countCPUList counts the CPUs of a kernel CPU list ("0-3,8,10-11\n");
// 0 if it is not one.
func countCPUList(s string) int {
	n := 0
	for _, part := range strings.Split(strings.TrimSpace(s), ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return 0
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return 0
			}
		}
		n += b - a + 1
	}
	return n
}
