package main

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/proxymode"
	"github.com/svcproxy/svcproxy/sysctl"
)

// tuner is what tune reaches of the kernel.
type tuner struct {
	sysctls, modules sysctl.Params // /proc/sys (conntrack's, ARP's and the IPVS mode's), /sys/module
	cpus             int           // the node's
	release          string        // the kernel's (uname -r)
	// loadConntrack and loadIPVS ask the kernel for nf_conntrack and ip_vs,
	// whose parameters exist only once they are loaded: --init-only may run
	// on a fresh node before anything has used them.
	loadConntrack, loadIPVS func() error
}

// hostTuner is this node's kernel.
func hostTuner() tuner {
	return tuner{
		sysctls: sysctl.Files{}, modules: sysctl.Module, cpus: nodeCPUs(), release: ipvs.KernelRelease(),
		loadConntrack: func() error {
			// A ctnetlink request loads nf_conntrack_netlink, and with it
			// nf_conntrack; reading the table is the cheapest there is.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := conntrack.NewNetlink("").Delete(ctx, netfilter.IPv4, func(conntrack.Flow) bool { return false })
			return err
		},
		loadIPVS: ipvs.Available, // looks the IPVS netlink family up, else modprobes ip_vs
	}
}

// tune sets the kernel parameters kube-proxy sets at start: its conntrack
// section (conntrack.Tune) in every mode but the userspace mode with
// --steering=none (svcproxy on loopback or a static file: no node's
// traffic through its NAT), unless --init-only asks; strict ARP
// (--ipvs-strict-arp) in the IPVS mode, with local steering, and with a
// mode the Node's annotation is to pick (whichever it picks); and, for
// --init-only with --proxy-mode=ipvs, the IPVS mode's. What it cannot set
// it names in a warning and goes on: in a container that is not
// privileged /proc/sys is read-only, and the DaemonSet's privileged init
// container (svcproxy --init-only) is what sets them.
func tune(o *options, k tuner, log *zap.Logger) {
	if runtime.GOOS != "linux" {
		return
	}
	// A mode left to the Node's annotation may be a kernel mode, the IPVS
	// mode among them: the Node is not read yet.
	byAnnotation := o.proxyMode == "" && (o.kubeconfig != "" || o.master != "" || o.inCluster)
	maybeKernel := byAnnotation || o.proxyMode == proxymode.IPTables || o.proxyMode == proxymode.IPVS || o.proxyMode == proxymode.NFTables
	if o.steering == "none" && !maybeKernel && !o.initOnly {
		log.Debug("leaving connection tracking as it is: the userspace mode with --steering=none uses no NAT")
	} else {
		if _, err := k.sysctls.Sysctl(conntrack.MaxSysctl); errors.Is(err, fs.ErrNotExist) && o.initOnly {
			if err := k.loadConntrack(); err != nil {
				log.Warn("cannot load connection tracking (nf_conntrack) to tune it", zap.Error(err))
			}
		}
		changed, failed := conntrack.Tune(o.conntrack, k.cpus, k.sysctls, k.modules)
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
	if o.strictARP && (o.proxyMode == proxymode.IPVS || byAnnotation || o.steering == "local") {
		for _, p := range [][2]string{{"net/ipv4/conf/all/arp_ignore", "1"}, {"net/ipv4/conf/all/arp_announce", "2"}} {
			old, wrote, err := sysctl.Ensure(k.sysctls, p[0], p[1], nil)
			switch {
			case err != nil:
				log.Warn("cannot set strict ARP (--ipvs-strict-arp): run svcproxy --init-only with the privilege to write /proc/sys, or set it on the node", zap.Error(err))
			case wrote:
				log.Info("set strict ARP (--ipvs-strict-arp)", zap.String("parameter", p[0]+"="+p[1]), zap.String("was", old))
			}
		}
	}
	if o.initOnly && o.proxyMode == proxymode.IPVS {
		if err := k.loadIPVS(); err != nil {
			log.Warn("cannot load IPVS (ip_vs) to set the IPVS mode's parameters", zap.Error(err))
		} else if set, err := ipvs.EnsureSysctls(k.sysctls, k.release); err != nil {
			log.Warn("cannot set the IPVS mode's parameters", zap.Error(err))
		} else {
			log.Info("the IPVS mode's parameters are set", zap.Strings("changed", set))
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
