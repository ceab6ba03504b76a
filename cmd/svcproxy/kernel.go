package main

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/kernelmodes/iptables"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/lb"
)

// kernelMode is a mode whose rules the kernel runs by itself.
type kernelMode interface {
	Apply(ctx context.Context, snap *lb.Snapshot, full bool) error
	Cleanup(ctx context.Context) error
	Repairs() uint64
}

// kernel drives a kernel mode. On exit it leaves the rules in place, as
// kube-proxy does: Services keep working while svcproxy restarts, and the
// next svcproxy takes the rules over with its first full sync.
type kernel struct{ m kernelMode }

func (k kernel) Apply(ctx context.Context, snap *lb.Snapshot, full bool) error {
	return k.m.Apply(ctx, snap, full)
}

func (k kernel) Shutdown(context.Context, bool) error { return nil }

func newIPTablesMode(o *options, log *zap.Logger) (*iptables.Mode, error) {
	return iptables.New(iptables.Config{
		NodePortAddresses: o.nodePortAddresses,
		ClusterCIDRs:      o.clusterCIDRs,
		MasqueradeAll:     o.masqueradeAll,
		AvoidMark:         uint32(max(o.mark, 0)),
		Logger:            log,
	})
}

func newIPVSMode(o *options, log *zap.Logger) (*ipvs.Mode, error) {
	return ipvs.New(ipvs.Config{
		Scheduler:         o.ipvsScheduler,
		NodePortAddresses: o.nodePortAddresses,
		MasqueradeAll:     o.masqueradeAll,
		DrainTimeout:      o.drainTimeout,
		Logger:            log,
	})
}

// newKernel builds a kernel mode's dataplane and exports its repair count.
func newKernel(name string, m kernelMode, reg prometheus.Registerer) kernel {
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "svcproxy", Subsystem: name, Name: "repairs_total",
		Help: "Full syncs that found the " + name + " mode's rules tampered with and repaired them.",
	}, func() float64 { return float64(m.Repairs()) }))
	return kernel{m}
}
