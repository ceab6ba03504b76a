package main

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/svcproxy/svcproxy/connlog"
	"github.com/svcproxy/svcproxy/forwarder"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/proxymode"
)

// options are svcproxy's command-line settings.
type options struct {
	services      string
	kubeconfig    string
	inCluster     bool // take Services from the cluster the pod runs in (--config without a kubeconfig)
	writeConfigTo string
	proxyMode     proxymode.Mode

	steering          string // "none" or "redirect"
	redirectPort      uint16
	nodePortAddresses []netip.Prefix
	cleanup           bool
	handoverSocket    string
	clusterCIDRs      []netip.Prefix
	masqueradeAll     bool
	ipvsScheduler     string
	pidFile           string

	workers            int
	dialTimeouts       []time.Duration
	idleTimeout        time.Duration
	drainTimeout       time.Duration
	mark               int
	maxConns           int64
	maxConnsPerService int64
	algorithm          lb.Algorithm

	hostname string
	zone     string

	syncPeriod    time.Duration
	minSyncPeriod time.Duration

	metricsAddr   string
	healthzAddr   string
	profilingAddr string

	connLog       string
	connLogSample int

	logLevel  zapcore.Level
	logFormat string
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("svcproxy", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: svcproxy [flags]\n\nsvcproxy makes Kubernetes Services work on a node with a fast userspace L4 proxy.\nWith no flags it serves the embedded example services file.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	host, _ := os.Hostname()
	configPath := fs.String("config", "", "a KubeProxyConfiguration-shaped file (kubeproxy.config.k8s.io/v1alpha1, with an svcproxy section); flags given on the command line win over it")
	fs.StringVar(&o.writeConfigTo, "write-config-to", "", "write the effective configuration in --config's shape to this file ('-': stdout) and exit")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the API server to take Services and EndpointSlices from; empty: the --services file")
	fs.StringVar(&o.services, "services", "", "static services file (YAML); empty: the embedded example (examples/services.yaml)")
	proxyMode := fs.String("proxy-mode", "", "userspace (the forwarder), iptables (kernel DNAT) or ipvs; empty: userspace. A mode the kernel cannot run falls back ipvs → iptables → userspace")
	fs.StringVar(&o.steering, "steering", "none", "how Service traffic reaches the forwarder: redirect (iptables REDIRECT of every ClusterIP, ExternalIP, LoadBalancer IP and NodePort; needs root or CAP_NET_ADMIN) or none (listen on each frontend directly: for loopback and static files)")
	redirectPort := fs.Uint("redirect-port", 15001, "TCP port the redirect rules send connections to (with --steering=redirect)")
	nodePortAddresses := fs.String("nodeport-addresses", "", "comma-separated CIDRs: NodePorts only on the node's addresses inside them; empty: all of them")
	fs.StringVar(&o.handoverSocket, "handover-socket", "auto", "unix socket for zero-downtime restarts: a new svcproxy takes the running one's sockets through it (SIGUSR2 starts one from the binary on disk); auto: /run/svcproxy/handover-<network namespace inode>.sock, so svcproxys in different network namespaces never meet; empty: off")
	fs.StringVar(&o.pidFile, "pid-file", "", "write the process ID here (a successor overwrites it)")
	clusterCIDRs := fs.String("cluster-cidr", "", "iptables mode: comma-separated pod CIDRs (one per family); ClusterIP traffic from outside them is masqueraded")
	fs.BoolVar(&o.masqueradeAll, "masquerade-all", false, "iptables and ipvs modes: masquerade all Service traffic")
	fs.StringVar(&o.ipvsScheduler, "ipvs-scheduler", "rr", "ipvs mode: the default scheduler: rr, wrr, lc, wlc, sh, dh or mh")
	fs.BoolVar(&o.cleanup, "cleanup", false, "remove every rule and set svcproxy installs, in any mode, and exit")
	fs.IntVar(&o.workers, "workers", 0, "listening sockets (and accept loops) per address, sharing it with SO_REUSEPORT; 0: GOMAXPROCS")
	dialTimeouts := fs.String("dial-timeouts", "250ms,500ms,1s,2s", "per-attempt backend connect timeouts; their number bounds the attempts, each to a different backend")
	fs.DurationVar(&o.idleTimeout, "idle-timeout", time.Hour, "close a connection idle this long in both directions; negative: never")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", 30*time.Second, "how long connections to a removed backend, and all connections at shutdown, may continue")
	mark := fs.String("mark", fmt.Sprintf("%#x", forwarder.DefaultMark), "SO_MARK of upstream sockets (needs CAP_NET_ADMIN); 0 or negative: none")
	fs.Int64Var(&o.maxConns, "max-conns", 0, "cap on open connections; 0: none")
	fs.Int64Var(&o.maxConnsPerService, "max-conns-per-service", 0, "cap on open connections per Service port; 0: none")
	algorithm := fs.String("algorithm", "round-robin", "default picker: round-robin, random, least-conn or maglev")
	fs.StringVar(&o.hostname, "hostname-override", host, "this node's name, matched against endpoints' nodeName for Local traffic policies")
	fs.StringVar(&o.zone, "zone", "", "this node's topology zone, for topology-aware routing hints")
	fs.DurationVar(&o.syncPeriod, "sync-period", 30*time.Second, "longest time between syncs that check and repair the rules (the iptables mode rewrites everything hourly); /healthz fails when an update waits twice this")
	fs.DurationVar(&o.minSyncPeriod, "min-sync-period", 0, "shortest time between syncs; bursts of changes in it are applied together")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", "127.0.0.1:10249", "address of /metrics; empty: off")
	fs.StringVar(&o.healthzAddr, "healthz-bind-address", "0.0.0.0:10256", "address of /healthz and /livez; empty: off")
	fs.StringVar(&o.profilingAddr, "profiling-bind-address", "", "serve Go's /debug/pprof/ here, on a loopback address only; empty: off")
	fs.StringVar(&o.connLog, "conn-log", connlog.DefaultPath, "per-connection JSON log file; '-': stdout; empty: off")
	fs.IntVar(&o.connLogSample, "conn-log-sample", 1, "log 1 of every N successful connections (failed ones always)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "console", "console or json")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *configPath != "" {
		cfg, err := applyConfigFile(fs, *configPath)
		if err != nil {
			return nil, err
		}
		o.inCluster = cfg.ClientConnection.Kubeconfig == "" && o.services == "" && o.kubeconfig == ""
	}

	var err error
	if o.clusterCIDRs, err = parsePrefixes(*clusterCIDRs); err != nil {
		return nil, fmt.Errorf("--cluster-cidr: %w", err)
	}
	if o.proxyMode, err = proxymode.Parse(*proxyMode); err != nil {
		return nil, fmt.Errorf("--proxy-mode: %w", err)
	}
	if o.handoverSocket, err = handoverSocketPath(o.handoverSocket); err != nil {
		return nil, fmt.Errorf("--handover-socket: %w", err)
	}
	if o.steering != "none" && o.steering != "redirect" {
		return nil, fmt.Errorf("--steering: want redirect or none, got %q", o.steering)
	}
	if *redirectPort == 0 || *redirectPort > 65535 {
		return nil, fmt.Errorf("--redirect-port: want 1-65535, got %d", *redirectPort)
	}
	o.redirectPort = uint16(*redirectPort)
	if o.nodePortAddresses, err = parsePrefixes(*nodePortAddresses); err != nil {
		return nil, fmt.Errorf("--nodeport-addresses: %w", err)
	}
	if o.dialTimeouts, err = parseDurations(*dialTimeouts); err != nil {
		return nil, fmt.Errorf("--dial-timeouts: %w", err)
	}
	m, err := strconv.ParseInt(*mark, 0, 64)
	if err != nil || m > 0xffffffff {
		return nil, fmt.Errorf("--mark: want a 32-bit number such as 0x80000, got %q", *mark)
	}
	o.mark = int(m)
	if m <= 0 {
		if o.steering == "redirect" {
			return nil, fmt.Errorf("--mark: --steering=redirect needs a mark, so the forwarder's own connections are not redirected")
		}
		o.mark = -1
	}
	if o.algorithm, err = lb.ParseAlgorithm(*algorithm); err != nil {
		return nil, fmt.Errorf("--algorithm: %w", err)
	}
	if err := o.logLevel.Set(*logLevel); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	if o.logFormat != "console" && o.logFormat != "json" {
		return nil, fmt.Errorf("--log-format: want console or json, got %q", o.logFormat)
	}
	if o.profilingAddr != "" {
		ap, err := netip.ParseAddrPort(o.profilingAddr)
		if err != nil || !ap.Addr().IsLoopback() {
			return nil, fmt.Errorf("--profiling-bind-address: want a loopback address and port such as 127.0.0.1:6060, got %q", o.profilingAddr)
		}
	}
	if o.connLogSample < 1 {
		return nil, fmt.Errorf("--conn-log-sample: want 1 or more, got %d", o.connLogSample)
	}
	if o.syncPeriod <= 0 {
		return nil, fmt.Errorf("--sync-period: must be positive, got %v", o.syncPeriod)
	}
	if o.minSyncPeriod < 0 || o.minSyncPeriod > o.syncPeriod {
		return nil, fmt.Errorf("--min-sync-period: want 0 to --sync-period, got %v", o.minSyncPeriod)
	}
	return o, nil
}

// parsePrefixes parses comma-separated CIDRs.
func parsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, err
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func parseDurations(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range strings.Split(s, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		if d <= 0 {
			return nil, fmt.Errorf("%v: must be positive", d)
		}
		out = append(out, d)
	}
	if len(out) > lb.MaxAttempts {
		return nil, fmt.Errorf("at most %d attempts, got %d", lb.MaxAttempts, len(out))
	}
	return out, nil
}

func newLogger(level zapcore.Level, format string) (*zap.Logger, error) {
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(level)
	cfg.Sampling = nil
	if format == "console" {
		cfg.Encoding = "console"
		cfg.EncoderConfig = zap.NewDevelopmentEncoderConfig()
	}
	log, err := cfg.Build()
	if err != nil {
		return nil, fmt.Errorf("building logger: %w", err)
	}
	return log, nil
}
