// Command bench is svcproxy's benchmark suite. It builds throwaway network
// namespaces (a client "pod", a node, three backends; 198.18.0.0/15, no
// default route), runs each mode carrying the same Service VIP, measures the
// data path and the control plane, and writes results/<time>/results.md,
// results.json (every sample) and SVG charts.
//
// Modes: direct (client to backend, no proxy: the floor), svcproxy-userspace
// (REDIRECT steering in its own nftables table), svcproxy-userspace-ipset
// (the same, steered with iptables + ipset), svcproxy-vip (the forwarder
// listening on VIPs the bench puts on the node's lo: the peers' footing),
// svcproxy-local (the same footing deployable: --steering=local puts the
// VIPs on svcproxy's own dummy interface), kube-dnat (kernel DNAT with
// kube-proxy-shaped rules the bench writes itself), the peers haproxy and
// nginx-stream when installed,
// svcproxy-iptables, svcproxy-nftables (its own nftables table, written over
// netlink) and svcproxy-ipvs, which this machine's kernel cannot run: it is
// reported as skipped, or with --ipvs-vm run inside a QEMU VM beside
// baselines measured in the same VM and reported apart (emulated CPU: not
// comparable with the host rows). Modes are interleaved over rounds (A B C,
// A B C) and medians reported.
//
//	sudo go run ./bench --quick      # 1 round, short tests, 1,000 Services (< 3 min)
//	sudo go run ./bench --full       # 5 rounds, 1,000 and 10,000 Services (about 35 min)
//	sudo go run ./bench --modes direct,svcproxy-userspace --rounds 2 --duration 3s
//	sudo go run ./bench --ipvs-vm    # also svcproxy-ipvs in a QEMU VM
//
// It needs root, iproute2, iptables (with iptables-legacy for kube-dnat) and
// ipset (svcproxy-nftables and svcproxy-userspace need no nft: they speak
// netlink); wrk and iperf3 are the load generators when installed (a built-in Go generator
// otherwise, labelled as such), nginx the HTTP backend (else the
// repo's svcproxy-backend). Every packet stays inside the namespaces it
// creates; nothing in the caller's namespace is changed. Ctrl-C stops every
// process it started, removes the namespaces and writes what was measured.
// It exits non-zero when a mode that should have run failed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg.Progress = os.Stderr
	if cfg.Rerender != "" {
		if err := rerender(cfg.Rerender); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	res, err := Run(ctx, cfg)
	if res != nil && res.Dir != "" {
		fmt.Fprintf(os.Stderr, "bench: results in %s\n", res.Dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		if ctx.Err() != nil {
			os.Exit(130)
		}
		os.Exit(1)
	}
}
