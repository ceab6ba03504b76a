package main

import (
	"flag"
	"fmt"
	"math/bits"
	"os"
	"strconv"
	"strings"

	"github.com/svcproxy/svcproxy/config"
	"github.com/svcproxy/svcproxy/proxymode"
)

// applyConfigFile sets every flag the command line did not set from the
// KubeProxyConfiguration-shaped file at path: flags win, as in kube-proxy.
func applyConfigFile(fs *flag.FlagSet, path string) (*config.Config, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	sync, minSync := cfg.SyncPeriods()
	sp := cfg.Svcproxy
	durations := make([]string, len(sp.DialTimeouts))
	for i, d := range sp.DialTimeouts {
		durations[i] = d.D().String()
	}
	values := map[string]string{
		"healthz-bind-address":              cfg.HealthzBindAddress,
		"metrics-bind-address":              cfg.MetricsBindAddress,
		"proxy-mode":                        cfg.Mode,
		"hostname-override":                 cfg.HostnameOverride,
		"nodeport-addresses":                strings.Join(cfg.NodePortAddresses, ","),
		"cluster-cidr":                      cfg.ClusterCIDR,
		"masquerade-all":                    strconv.FormatBool(cfg.IPTables.MasqueradeAll),
		"sync-period":                       sync.String(),
		"min-sync-period":                   minSync.String(),
		"ipvs-scheduler":                    cfg.IPVS.Scheduler,
		"ipvs-strict-arp":                   strconv.FormatBool(cfg.IPVS.StrictARP),
		"ipvs-tcp-timeout":                  cfg.IPVS.TCPTimeout.D().String(),
		"ipvs-tcpfin-timeout":               cfg.IPVS.TCPFinTimeout.D().String(),
		"ipvs-udp-timeout":                  cfg.IPVS.UDPTimeout.D().String(),
		"ipvs-exclude-cidrs":                strings.Join(cfg.IPVS.ExcludeCIDRs, ","),
		"kubeconfig":                        cfg.ClientConnection.Kubeconfig,
		"kube-api-qps":                      strconv.FormatFloat(float64(cfg.ClientConnection.QPS), 'g', -1, 32),
		"kube-api-burst":                    strconv.Itoa(int(cfg.ClientConnection.Burst)),
		"kube-api-content-type":             cfg.ClientConnection.ContentType,
		"config-sync-period":                cfg.ConfigSyncPeriod.D().String(),
		"bind-address":                      cfg.BindAddress,
		"conntrack-udp-timeout":             cfg.Conntrack.UDPTimeout.D().String(),
		"conntrack-max-per-core":            strconv.Itoa(int(cfg.Conntrack.MaxPerCore)),
		"conntrack-min":                     strconv.Itoa(int(cfg.Conntrack.Min)),
		"conntrack-tcp-timeout-established": cfg.Conntrack.TCPEstablishedTimeout.D().String(),
		"conntrack-tcp-timeout-close-wait":  cfg.Conntrack.TCPCloseWaitTimeout.D().String(),
		"conntrack-tcp-be-liberal":          strconv.FormatBool(cfg.Conntrack.TCPBeLiberal),
		"conntrack-udp-timeout-stream":      cfg.Conntrack.UDPStreamTimeout.D().String(),
		"proxy-name":                        sp.ProxyName,
		"steering":                          sp.Steering,
		"steering-backend":                  sp.SteeringBackend,
		"redirect-port":                     strconv.Itoa(int(sp.RedirectPort)),
		"workers":                           strconv.Itoa(sp.Workers),
		"dial-timeouts":                     strings.Join(durations, ","),
		"idle-timeout":                      sp.IdleTimeout.D().String(),
		"drain-timeout":                     sp.DrainTimeout.D().String(),
		"mark":                              fmt.Sprintf("%#x", sp.Mark),
		"max-conns":                         strconv.FormatInt(sp.MaxConns, 10),
		"max-conns-per-service":             strconv.FormatInt(sp.MaxConnsPerService, 10),
		"udp-receive-buffer":                strconv.Itoa(sp.UDPReceiveBuffer),
		"offload":                           sp.Offload,
		"io-uring":                          sp.IOUring,
		"worker-balance":                    sp.WorkerBalance,
		"master-worker":                     strconv.FormatBool(sp.MasterWorker),
		"algorithm":                         sp.Algorithm,
		"conn-log":                          sp.ConnLog,
		"conn-log-sample":                   strconv.Itoa(sp.ConnLogSample),
		"zone":                              sp.Zone,
		"handover-socket":                   sp.HandoverSocket,
	}
	if b := cfg.IPTables.MasqueradeBit; b != nil {
		values["iptables-masquerade-bit"] = strconv.Itoa(int(*b))
	}
	if a := cfg.OOMScoreAdj; a != nil {
		values["oom-score-adj"] = strconv.Itoa(int(*a))
	}
	for name, v := range values {
		if set[name] || (v == "" && name != "conn-log") || (name == "hostname-override" && v == "") {
			continue
		}
		if name == "dial-timeouts" && v == "" {
			continue
		}
		if err := fs.Set(name, v); err != nil {
			return nil, fmt.Errorf("--config %s: field for --%s: %w", path, name, err)
		}
	}
	return cfg, nil
}

// writeConfig writes the effective configuration (defaults, file, flags)
// in the configuration file's shape, to path ("-": stdout).
func writeConfig(o *options, path string) error {
	cfg := config.Default()
	cfg.HealthzBindAddress, cfg.MetricsBindAddress = o.healthzAddr, o.metricsAddr
	cfg.Mode = string(o.proxyMode)
	if cfg.Mode == "" {
		cfg.Mode = string(proxymode.Userspace)
	}
	cfg.HostnameOverride = o.hostname
	for _, p := range o.nodePortAddresses {
		cfg.NodePortAddresses = append(cfg.NodePortAddresses, p.String())
	}
	if o.nodePortPrimary {
		cfg.NodePortAddresses = []string{"primary"}
	}
	cfg.BindAddress = o.bindAddress.String()
	if o.oomScoreAdj != nil {
		adj := int32(*o.oomScoreAdj)
		cfg.OOMScoreAdj = &adj
	}
	bit := int32(bits.TrailingZeros32(o.masqueradeMark))
	cfg.IPTables.MasqueradeBit = &bit
	cfg.Conntrack = config.Conntrack{
		MaxPerCore: int32(o.conntrack.MaxPerCore), Min: int32(o.conntrack.Min),
		TCPEstablishedTimeout: config.Duration(o.conntrack.TCPEstablished), TCPCloseWaitTimeout: config.Duration(o.conntrack.TCPCloseWait),
		TCPBeLiberal: o.conntrack.TCPBeLiberal, UDPTimeout: config.Duration(o.udpIdleTimeout), UDPStreamTimeout: config.Duration(o.conntrack.UDPStream),
	}
	cfg.ConfigSyncPeriod = config.Duration(o.configSyncPeriod)
	for i, p := range o.clusterCIDRs {
		if i > 0 {
			cfg.ClusterCIDR += ","
		}
		cfg.ClusterCIDR += p.String()
	}
	cfg.IPTables.MasqueradeAll = o.masqueradeAll
	cfg.IPTables.SyncPeriod, cfg.IPTables.MinSyncPeriod = config.Duration(o.syncPeriod), config.Duration(o.minSyncPeriod)
	cfg.IPVS.SyncPeriod, cfg.IPVS.MinSyncPeriod = config.Duration(o.syncPeriod), config.Duration(o.minSyncPeriod)
	cfg.IPVS.Scheduler, cfg.IPVS.StrictARP = o.ipvsScheduler, o.strictARP
	cfg.IPVS.TCPTimeout = config.Duration(o.ipvsTimeouts.TimeoutTCP)
	cfg.IPVS.TCPFinTimeout = config.Duration(o.ipvsTimeouts.TimeoutTCPFin)
	cfg.IPVS.UDPTimeout = config.Duration(o.ipvsTimeouts.TimeoutUDP)
	cfg.IPVS.ExcludeCIDRs = nil
	for _, p := range o.ipvsExcludeCIDRs {
		cfg.IPVS.ExcludeCIDRs = append(cfg.IPVS.ExcludeCIDRs, p.String())
	}
	cfg.ClientConnection = config.ClientConnection{Kubeconfig: o.kubeconfig, QPS: o.kubeAPIQPS, Burst: int32(o.kubeAPIBurst), ContentType: o.kubeAPIContentType}
	sp := &cfg.Svcproxy
	sp.Steering, sp.RedirectPort, sp.Workers = o.steering, o.redirectPort, o.workers
	sp.SteeringBackend = string(o.steeringBackend)
	sp.DialTimeouts = nil
	for _, d := range o.dialTimeouts {
		sp.DialTimeouts = append(sp.DialTimeouts, config.Duration(d))
	}
	sp.IdleTimeout, sp.DrainTimeout = config.Duration(o.idleTimeout), config.Duration(o.drainTimeout)
	if o.mark > 0 {
		sp.Mark = uint32(o.mark)
	} else {
		sp.Mark = 0
	}
	sp.MaxConns, sp.MaxConnsPerService = o.maxConns, o.maxConnsPerService
	sp.UDPReceiveBuffer, sp.MasterWorker = o.udpReceiveBuffer, o.masterWorker
	sp.Offload, sp.IOUring, sp.WorkerBalance = string(o.offload), string(o.ioUring), o.workerBalance
	sp.Algorithm = o.algorithm.String()
	sp.ConnLog, sp.ConnLogSample, sp.Zone, sp.HandoverSocket = o.connLog, o.connLogSample, o.zone, o.handoverSocket
	sp.ProxyName = o.proxyName
	out := os.Stdout
	if path != "-" {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			return fmt.Errorf("--write-config-to: %w", err)
		}
		defer f.Close()
		out = f
	}
	if err := cfg.Write(out); err != nil {
		return fmt.Errorf("--write-config-to: %w", err)
	}
	return nil
}
