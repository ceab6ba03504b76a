package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"

	"github.com/svcproxy/svcproxy/config"
	"github.com/svcproxy/svcproxy/connlog"
	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/forwarder"
	"github.com/svcproxy/svcproxy/handover"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/netfilter"
	"github.com/svcproxy/svcproxy/proxymode"
	"github.com/svcproxy/svcproxy/redirect"
	"github.com/svcproxy/svcproxy/source/kube"
	"github.com/svcproxy/svcproxy/sysctl"
)

// options are svcproxy's command-line settings.
type options struct {
	services      string
	kubeconfig    string
	master        string // API server address, overriding the kubeconfig's (kube-proxy's --master)
	inCluster     bool   // take Services from the cluster the pod runs in (in a pod, or --config, without a kubeconfig)
	writeConfigTo string
	proxyMode     proxymode.Name
	proxyName     string // serve only Services labelled service.kubernetes.io/service-proxy-name=proxyName; "": those without it

	kubeAPIQPS         float32
	kubeAPIBurst       int
	kubeAPIContentType string
	configSyncPeriod   time.Duration // informer resync; 0: none

	steering          string           // "none", "redirect" or "local"
	steeringBackend   redirect.Backend // what writes --steering=redirect's rules: auto, nftables or iptables
	redirectPort      uint16
	bindAddress       netip.Addr // kube-proxy's --bind-address: this node's primary IP of its family; unspecified: from the Node
	nodePortAddresses []netip.Prefix
	nodePortPrimary   bool             // --nodeport-addresses=primary: the node's primary IPs, resolved once the Node is known
	ipv6              bool             // the node serves IPv6 too: set by detectIPv6, not a flag
	steeredBy         redirect.Backend // the userspace mode's resolved steering backend: set when it is built, not a flag
	steerTo           []netip.Addr     // the node addresses REDIRECT steering DNATs to (steerAddrs): set at start, not a flag
	cleanup           bool
	force             bool   // --cleanup even while a running svcproxy owns the rules
	check             bool   // --check: validate the files and exit
	configFile        string // --config
	configErr         error  // with --check: what is wrong with --config, for check to list
	initOnly          bool
	handoverSocket    string
	clusterCIDRs      []netip.Prefix
	masqueradeAll     bool
	masqueradeMark    uint32 // kernel modes' masquerade mark, 1<<--iptables-masquerade-bit
	ipvsScheduler     string
	strictARP         bool // --ipvs-strict-arp
	ipvsTimeouts      ipvs.Timeouts
	ipvsExcludeCIDRs  []netip.Prefix
	pidFile           string
	successorWait     time.Duration
	oomScoreAdj       *int // nil: leave as it is

	workers            int
	dialTimeouts       []time.Duration
	idleTimeout        time.Duration
	udpIdleTimeout     time.Duration // userspace mode's UDP flows; 0: the forwarder's default
	conntrack          conntrack.Tuning
	drainTimeout       time.Duration
	mark               int
	maxConns           int64
	maxConnsPerService int64
	udpReceiveBuffer   int
	offload            forwarder.Offload
	ioUring            forwarder.IOUring
	workerBalance      string // on, off
	masterWorker       bool
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

	// warnings are said once the logger exists: kube-proxy flags and
	// configuration fields svcproxy accepts but does not use.
	warnings []string
}

// environment is what parseFlags reads of the process's surroundings.
type environment struct {
	// inPod: KUBERNETES_SERVICE_HOST and _PORT are set and the
	// ServiceAccount token is mounted, as rest.InClusterConfig needs.
	inPod bool
	// stdout receives --help; nil: os.Stdout.
	stdout io.Writer
}

const serviceAccountToken = "/var/run/secrets/kubernetes.io/serviceaccount/token"

// hostEnvironment reads this process's environment.
func hostEnvironment() environment {
	_, err := os.Stat(serviceAccountToken)
	return environment{inPod: os.Getenv("KUBERNETES_SERVICE_HOST") != "" && os.Getenv("KUBERNETES_SERVICE_PORT") != "" && err == nil}
}

// errHint marks an error in the flags: main prints it once, with a pointer
// to --help rather than the whole usage.
var errHint = errors.New("run 'svcproxy --help' for the flags")

// errVersion asks main to print the version and exit.
var errVersion = errors.New("version requested")

// flagSections groups the flags for --help.
type flagSections struct {
	fs       *flag.FlagSet
	sections []flagSection
	seen     map[string]bool
}

type flagSection struct {
	title string
	names []string
	brief bool // listed by name only (kube-proxy flags svcproxy ignores)
}

// section registers the flags add defines under title.
func (s *flagSections) section(title string, brief bool, add func()) {
	add()
	sec := flagSection{title: title, brief: brief}
	s.fs.VisitAll(func(f *flag.Flag) {
		if !s.seen[f.Name] {
			s.seen[f.Name] = true
			sec.names = append(sec.names, f.Name)
		}
	})
	s.sections = append(s.sections, sec)
}

// print writes the grouped help.
func (s *flagSections) print(w io.Writer) {
	fmt.Fprint(w, `Usage: svcproxy [flags]

svcproxy makes Kubernetes Services work on a node, like kube-proxy, with a
fast userspace L4 proxy (or kernel iptables/IPVS/nftables modes). It takes
kube-proxy's flags and configuration file where the meaning is the same.
With no flags, and outside a pod, it serves the embedded example services
file in the userspace mode.
`)
	for _, sec := range s.sections {
		fmt.Fprintf(w, "\n%s:\n", sec.title)
		if sec.brief {
			var names []string
			for _, n := range sec.names {
				names = append(names, "--"+n)
			}
			fmt.Fprintf(w, "  %s\n", wrap(strings.Join(names, ", "), 76, "  "))
			continue
		}
		for _, n := range sec.names {
			f := s.fs.Lookup(n)
			typ, usage := flag.UnquoteUsage(f)
			line := "  --" + f.Name
			if typ != "" {
				line += " " + typ
			}
			fmt.Fprintln(w, line)
			switch {
			case f.DefValue == "" || f.DefValue == "false" || f.DefValue == "0" || f.DefValue == "0s":
			case typ == "string":
				usage += fmt.Sprintf(" (default %q)", f.DefValue)
			default:
				usage += fmt.Sprintf(" (default %s)", f.DefValue)
			}
			fmt.Fprintf(w, "      %s\n", wrap(usage, 74, "      "))
		}
	}
}

// wrap breaks s into lines of at most width, indenting the continuations.
func wrap(s string, width int, indent string) string {
	var b strings.Builder
	n := 0
	for i, word := range strings.Fields(s) {
		if i > 0 {
			if n+1+len(word) > width {
				b.WriteString("\n" + indent)
				n = 0
			} else {
				b.WriteByte(' ')
				n++
			}
		}
		b.WriteString(word)
		n += len(word)
	}
	return b.String()
}

// ignoredFlag is a kube-proxy flag svcproxy accepts and does not use.
type ignoredFlag struct {
	isBool bool
	set    bool
	value  string
}

func (f *ignoredFlag) String() string {
	if f == nil {
		return ""
	}
	return f.value
}
func (f *ignoredFlag) Set(v string) error { f.set, f.value = true, v; return nil }
func (f *ignoredFlag) IsBoolFlag() bool   { return f.isBool }

// kubeProxyIgnored are kube-proxy's flags svcproxy has no use for, with
// why; each given is said in a startup warning. Bool flags are marked.
var kubeProxyIgnored = []struct {
	name, why string
	isBool    bool
}{
	{"feature-gates", "svcproxy has no feature gates", false},
	{"bind-address-hard-fail", "svcproxy always fails when it cannot bind", true},
	{"profiling", "use --profiling-bind-address", true},
	{"show-hidden-metrics-for-version", "svcproxy hides no metrics", false},
	{"iptables-localhost-nodeports", "NodePorts on localhost are not served", true},
	{"detect-local-mode", "svcproxy tells local traffic by --cluster-cidr only", false},
	{"pod-bridge-interface", "svcproxy tells local traffic by --cluster-cidr only", false},
	{"pod-interface-name-prefix", "svcproxy tells local traffic by --cluster-cidr only", false},
	{"healthz-port", "use --healthz-bind-address", false},
	{"metrics-port", "use --metrics-bind-address", false},
	{"vmodule", "per-file verbosity is not supported; use --v or --log-level", false},
	{"log-flush-frequency", "svcproxy logs unbuffered", false},
	{"log-text-split-stream", "svcproxy logs to stderr", true},
	{"log-text-info-buffer-size", "svcproxy logs unbuffered", false},
	{"log-json-split-stream", "svcproxy logs to stderr", true},
	{"log-json-info-buffer-size", "svcproxy logs unbuffered", false},
	{"logtostderr", "svcproxy logs to stderr", true},
	{"alsologtostderr", "svcproxy logs to stderr", true},
	{"log-dir", "svcproxy logs to stderr", false},
	{"log-file", "svcproxy logs to stderr", false},
	{"skip-headers", "not supported", true},
}

func parseFlags(args []string, env environment) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("svcproxy", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // main prints the error once; --help prints the grouped help
	fs.Usage = func() {}
	secs := &flagSections{fs: fs, seen: map[string]bool{}}
	host, _ := os.Hostname()

	var (
		configPath, proxyMode, nodePortAddresses, clusterCIDRs, ipvsExclude, bindAddress, dialTimeouts, mark, algorithm, logLevel, logFormat *string
		redirectPort                                                                                                                         *uint
		masqBit, oomScoreAdj, verbosity                                                                                                      *int
		iptSync, iptMinSync, ipvsSync, ipvsMinSync                                                                                           *time.Duration
		version                                                                                                                              *bool
		qps                                                                                                                                  *float64
		loggingFormat, steeringBackend, offload, ioUring, workerBalance                                                                      *string
		maxPerCore, ctMin                                                                                                                    *int
	)
	secs.section("Configuration", false, func() {
		configPath = fs.String("config", "", "a KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1, with an svcproxy: section); flags given on the command line win over it")
		fs.StringVar(&o.writeConfigTo, "write-config-to", "", "write the effective configuration in --config's shape to this file ('-': stdout) and exit")
		fs.BoolVar(&o.cleanup, "cleanup", false, "remove every rule and set svcproxy installs, in any mode, and exit; refused while a running svcproxy owns them, unless --force")
		fs.BoolVar(&o.force, "force", false, "with --cleanup: remove the rules even while a running svcproxy owns them")
		fs.BoolVar(&o.check, "check", false, "validate the services file (--services) and the configuration file (--config), list every problem and exit: 0 if there is none, else 1")
		fs.BoolVar(&o.initOnly, "init-only", false, "set the kernel parameters that need the privilege to write /proc/sys (the conntrack section's, and the IPVS mode's with --proxy-mode=ipvs), then exit: for a privileged init container, so svcproxy itself runs with NET_ADMIN and NET_RAW only (kube-proxy's flag)")
		version = fs.Bool("version", false, "print the version and commit and exit")
	})
	secs.section("Source of Services", false, func() {
		fs.StringVar(&o.services, "services", "", "static services file (YAML); empty: the cluster (--kubeconfig, --master, or the pod's ServiceAccount), else the embedded example (userspace mode only)")
		fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the API server to take Services and EndpointSlices from; empty in a pod: the pod's ServiceAccount")
		fs.StringVar(&o.master, "master", "", "address of the Kubernetes API server (overrides the kubeconfig's)")
		qps = fs.Float64("kube-api-qps", 5, "requests per second to the API server")
		fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", 10, "burst of requests to the API server above --kube-api-qps")
		fs.StringVar(&o.kubeAPIContentType, "kube-api-content-type", "application/vnd.kubernetes.protobuf", "content type of requests to the API server: application/vnd.kubernetes.protobuf or application/json")
		fs.DurationVar(&o.configSyncPeriod, "config-sync-period", 15*time.Minute, "how often the informers re-deliver their cached objects; 0: never")
		fs.StringVar(&o.proxyName, "proxy-name", "", "serve only Services labelled service.kubernetes.io/service-proxy-name=<this>, so proxies can split a cluster's Services; empty: only Services without that label, as kube-proxy")
		fs.StringVar(&o.hostname, "hostname-override", host, "this node's name, matched against endpoints' nodeName for Local traffic policies")
		fs.StringVar(&o.zone, "zone", "", "this node's topology zone, for topology-aware routing hints; empty: the Node's topology.kubernetes.io/zone label, followed as it changes")
	})
	secs.section("Proxy mode", false, func() {
		proxyMode = fs.String("proxy-mode", "", "userspace (the forwarder), iptables (kernel DNAT), ipvs or nftables; empty: the Node's net.experimental.kubernetes.io/proxy-mode annotation, else userspace. A mode the kernel cannot run falls back ipvs → iptables → userspace, nftables → iptables → userspace")
		fs.DurationVar(&o.syncPeriod, "sync-period", 30*time.Second, "longest time between syncs that check and repair the rules (the iptables mode rewrites everything hourly); /healthz fails when an update waits twice this")
		fs.DurationVar(&o.minSyncPeriod, "min-sync-period", 0, "shortest time between syncs; bursts of changes in it are applied together")
		iptSync = fs.Duration("iptables-sync-period", 0, "kube-proxy's name for --sync-period (iptables, nftables and userspace modes)")
		iptMinSync = fs.Duration("iptables-min-sync-period", 0, "kube-proxy's name for --min-sync-period (iptables, nftables and userspace modes)")
		ipvsSync = fs.Duration("ipvs-sync-period", 0, "kube-proxy's name for --sync-period (ipvs mode)")
		ipvsMinSync = fs.Duration("ipvs-min-sync-period", 0, "kube-proxy's name for --min-sync-period (ipvs mode)")
		nodePortAddresses = fs.String("nodeport-addresses", "", "comma-separated CIDRs: NodePorts only on the node's addresses inside them; 'primary': only on the node's primary IPs (from the Node object); empty: all of them")
		bindAddress = fs.String("bind-address", "0.0.0.0", "this node's primary IP of its family, overriding the Node object's (as kube-proxy; used by --nodeport-addresses=primary, and the address --steering=redirect DNATs its family to)")
		clusterCIDRs = fs.String("cluster-cidr", "", "comma-separated pod CIDRs (one per family): the iptables and nftables modes masquerade ClusterIP traffic from outside them; a pod within them that reaches an external address of a Service with externalTrafficPolicy Local gets its endpoints on every node, as from kube-proxy (not in the ipvs mode, which serves every client alike, as kube-proxy's)")
		fs.BoolVar(&o.masqueradeAll, "masquerade-all", false, "iptables, ipvs and nftables modes: masquerade all traffic sent to ClusterIPs, from pods too (kube-proxy's meaning; external traffic is masqueraded as without it: Cluster policy yes, Local no)")
		masqBit = fs.Int("iptables-masquerade-bit", 14, "iptables, ipvs and nftables modes: the bit of the packet mark that asks for masquerade, 0-31")
		fs.StringVar(&o.ipvsScheduler, "ipvs-scheduler", "rr", "ipvs mode: the default scheduler: "+strings.Join(config.IPVSSchedulers, ", "))
		fs.BoolVar(&o.strictARP, "ipvs-strict-arp", false, "ipvs mode and --steering=local: set net.ipv4.conf.all.arp_ignore=1 and arp_announce=2, so the node answers ARP for the virtual IPs on its dummy interface on no other (with MetalLB-style ARP announcements); set at start, or by --init-only")
		fs.DurationVar(&o.ipvsTimeouts.TimeoutTCP, "ipvs-tcp-timeout", 0, "ipvs mode: the node's IPVS timeout of idle TCP connections (ipvsadm --set); 0: leave it (the kernel's 900s)")
		fs.DurationVar(&o.ipvsTimeouts.TimeoutTCPFin, "ipvs-tcpfin-timeout", 0, "ipvs mode: the IPVS timeout of TCP connections after a FIN; 0: leave it (120s)")
		fs.DurationVar(&o.ipvsTimeouts.TimeoutUDP, "ipvs-udp-timeout", 0, "ipvs mode: the IPVS timeout of UDP flows; 0: leave it (300s)")
		ipvsExclude = fs.String("ipvs-exclude-cidrs", "", "ipvs mode: comma-separated CIDRs whose IPVS virtual servers are others' (a keepalived's on a node IP): left alone by syncs and --cleanup unless svcproxy's Services ask for them or this process created them")
	})
	secs.section("Userspace proxy", false, func() {
		fs.StringVar(&o.steering, "steering", "none", "how Service traffic reaches the forwarder: redirect (REDIRECT of every ClusterIP, ExternalIP, LoadBalancer IP and NodePort, written by --steering-backend; needs root or CAP_NET_ADMIN), local (the virtual IPs put on dummy interface svcproxy-vips as local addresses, as kube-proxy's IPVS mode does, and the forwarder listening on each frontend and NodePort: no rules, no NAT; needs CAP_NET_ADMIN) or none (listen on each frontend directly: for loopback and static files)")
		steeringBackend = fs.String("steering-backend", "auto", "what writes --steering=redirect's rules: nftables (one table, svcproxy-steering, per family, over netlink: no iptables, ipset or nft binary), iptables (iptables + ipset) or auto (nftables when the kernel takes the table, else iptables)")
		redirectPort = fs.Uint("redirect-port", 15001, "TCP port the redirect rules send connections to (with --steering=redirect)")
		fs.IntVar(&o.workers, "workers", 0, "listening sockets (and accept loops) per address, sharing it with SO_REUSEPORT; 0: GOMAXPROCS")
		dialTimeouts = fs.String("dial-timeouts", "250ms,500ms,1s,2s", "per-attempt backend connect timeouts; their number bounds the attempts, each to a different backend")
		fs.DurationVar(&o.idleTimeout, "idle-timeout", time.Hour, "close a connection idle this long in both directions; negative: never")
		fs.DurationVar(&o.drainTimeout, "drain-timeout", 30*time.Second, "how long connections to a removed backend, and all connections at shutdown, may continue")
		mark = fs.String("mark", fmt.Sprintf("%#x", forwarder.DefaultMark), "SO_MARK of upstream sockets (needs CAP_NET_ADMIN); 0 or negative: none")
		fs.Int64Var(&o.maxConns, "max-conns", 0, "cap on open connections; 0: none")
		fs.Int64Var(&o.maxConnsPerService, "max-conns-per-service", 0, "cap on open connections per Service port; 0: none")
		fs.BoolVar(&o.masterWorker, "master-worker", false, "run a master process that keeps the listening sockets and starts a new serving process (the worker) when it dies, so a crash queues new connections instead of refusing them (HAProxy's master-worker); needs --handover-socket; the master's PID goes to --pid-file, SIGUSR2 to it starts a new worker; a fourth death within 10 minutes ends the master with the worker's error")
		offload = fs.String("offload", string(forwarder.OffloadNone), "userspace mode: move established TCP connections' bytes in the kernel: none, or sockmap (a BPF sockmap; needs CAP_BPF and CAP_NET_ADMIN, falls back to none with a warning where the kernel refuses it)")
		workerBalance = fs.String("worker-balance", "on", "userspace mode: on, a worker that accepts a TCP connection while another has clearly fewer (two, and a sixteenth of its own) hands it over, so that a few long-lived connections share the cores (SO_REUSEPORT spreads them by a hash of their addresses, not by load; like HAProxy's accept queues or Envoy's exact_balance); off leaves each where the kernel put it")
		ioUring = fs.String("io-uring", string(forwarder.IOUringAuto), "userspace mode: move small messages in batches through io_uring, two system calls per batch instead of two per message: auto (where the kernel allows it; refused, it logs why and goes on without) or off")
		fs.IntVar(&o.udpReceiveBuffer, "udp-receive-buffer", 0, "userspace mode: SO_RCVBUF of UDP frontend and flow sockets in bytes (past net.core.rmem_max with CAP_NET_ADMIN); 0: the kernel's default")
		algorithm = fs.String("algorithm", "round-robin", "default picker: round-robin, random, least-conn or maglev")
		fs.StringVar(&o.connLog, "conn-log", connlog.DefaultPath, "per-connection JSON log file; '-': stdout; empty: off")
		fs.IntVar(&o.connLogSample, "conn-log-sample", 1, "log 1 of every N successful connections (failed ones always)")
	})
	secs.section("Connection tracking (set at start but in userspace --steering=none)", false, func() {
		maxPerCore = fs.Int("conntrack-max-per-core", conntrack.DefaultTuning.MaxPerCore, "raise nf_conntrack_max to this many entries per CPU (and the nf_conntrack hashsize to a quarter of the table); 0: leave the table's size alone")
		ctMin = fs.Int("conntrack-min", conntrack.DefaultTuning.Min, "the least nf_conntrack_max that --conntrack-max-per-core raises it to")
		fs.DurationVar(&o.conntrack.TCPEstablished, "conntrack-tcp-timeout-established", conntrack.DefaultTuning.TCPEstablished, "nf_conntrack_tcp_timeout_established; 0: leave it")
		fs.DurationVar(&o.conntrack.TCPCloseWait, "conntrack-tcp-timeout-close-wait", conntrack.DefaultTuning.TCPCloseWait, "nf_conntrack_tcp_timeout_close_wait; 0: leave it")
		fs.BoolVar(&o.conntrack.TCPBeLiberal, "conntrack-tcp-be-liberal", false, "set nf_conntrack_tcp_be_liberal, so packets outside the TCP window are not INVALID")
		fs.DurationVar(&o.udpIdleTimeout, "conntrack-udp-timeout", 0, "nf_conntrack_udp_timeout, and how long an idle UDP flow lives in the userspace mode; 0: the kernel's left alone, 30s in the userspace mode")
		fs.DurationVar(&o.conntrack.UDPStream, "conntrack-udp-timeout-stream", 0, "nf_conntrack_udp_timeout_stream; 0: leave it")
	})
	secs.section("Process", false, func() {
		fs.StringVar(&o.metricsAddr, "metrics-bind-address", "127.0.0.1:10249", "address of /metrics; empty: off")
		fs.StringVar(&o.healthzAddr, "healthz-bind-address", "0.0.0.0:10256", "address of /healthz and /livez; empty: off")
		fs.StringVar(&o.profilingAddr, "profiling-bind-address", "", "serve Go's /debug/pprof/ here, on a loopback address only; empty: off")
		fs.StringVar(&o.handoverSocket, "handover-socket", "auto", "unix socket for zero-downtime restarts: a new svcproxy takes the running one's sockets through it (SIGUSR2 starts one from the binary on disk); auto: /run/svcproxy/handover-<network namespace inode>.sock; empty: off")
		fs.DurationVar(&o.successorWait, "successor-wait", 0, "on SIGTERM, keep serving up to this long for a successor to take over (a DaemonSet whose new pod starts before the old one stops), which then keeps the rules; after handing over, stay until terminated, so kubelet does not restart the old version; 0: exit at once")
		fs.StringVar(&o.pidFile, "pid-file", "", "write the process ID here (a successor overwrites it)")
		oomScoreAdj = fs.Int("oom-score-adj", 0, "set this process's oom_score_adj, -1000 to 1000; unset: leave it")
		logLevel = fs.String("log-level", "info", "debug, info, warn or error")
		verbosity = fs.Int("v", 0, "kube-proxy's (klog) verbosity, when --log-level is not given: 0-3 info, 4 and more debug")
		logFormat = fs.String("log-format", "console", "console or json")
		loggingFormat = fs.String("logging-format", "text", "kube-proxy's name for --log-format: text (console) or json")
	})
	ignored := map[string]*ignoredFlag{}
	secs.section("kube-proxy flags accepted and ignored, each named in a startup warning", true, func() {
		for _, k := range kubeProxyIgnored {
			ignored[k.name] = &ignoredFlag{isBool: k.isBool}
			fs.Var(ignored[k.name], k.name, k.why)
		}
	})

	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		out := env.stdout
		if out == nil {
			out = os.Stdout
		}
		secs.print(out)
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("%w; %w", err, errHint)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q; %w", fs.Arg(0), errHint)
	}
	if *version {
		return nil, errVersion
	}
	cmdline := map[string]bool{} // flags given on the command line
	fs.Visit(func(f *flag.Flag) { cmdline[f.Name] = true })
	for _, k := range kubeProxyIgnored {
		if cmdline[k.name] {
			o.warnings = append(o.warnings, fmt.Sprintf("--%s: kube-proxy flag ignored: %s", k.name, k.why))
		}
	}
	if o.configFile = *configPath; o.configFile != "" {
		cfg, err := applyConfigFile(fs, *configPath)
		switch {
		case err != nil && o.check:
			o.configErr = err // --check lists it
		case err != nil:
			return nil, err
		default:
			for _, w := range cfg.Warnings {
				o.warnings = append(o.warnings, "--config "+*configPath+": "+w)
			}
		}
	}
	set := map[string]bool{} // flags given on the command line or by the file
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.kubeconfig == "" && o.master == "" && o.services == "" {
		o.inCluster = *configPath != "" || env.inPod
	}

	if o.proxyMode, err = proxymode.Parse(*proxyMode); err != nil {
		return nil, fmt.Errorf("--proxy-mode: %w", err)
	}
	serving := !o.cleanup && !o.initOnly && !o.check && o.writeConfigTo == ""
	if serving && (o.proxyMode == proxymode.IPTables || o.proxyMode == proxymode.IPVS || o.proxyMode == proxymode.NFTables) {
		if o.services == "" && o.kubeconfig == "" && o.master == "" && !o.inCluster {
			return nil, fmt.Errorf("--proxy-mode=%s: no source of Services: give --services, --kubeconfig or --master, or run in a pod (the embedded example file is for the userspace mode only: a kernel mode would leave its Services in the kernel)", o.proxyMode)
		}
	}
	if err := o.resolveSyncPeriods(cmdline, *iptSync, *iptMinSync, *ipvsSync, *ipvsMinSync); err != nil {
		return nil, err
	}
	if *qps < 0 {
		return nil, fmt.Errorf("--kube-api-qps: must not be negative, got %v", *qps)
	}
	o.kubeAPIQPS = float32(*qps)
	if o.kubeAPIBurst < 0 {
		return nil, fmt.Errorf("--kube-api-burst: must not be negative, got %d", o.kubeAPIBurst)
	}
	switch o.kubeAPIContentType {
	case "application/vnd.kubernetes.protobuf", "application/json":
	default:
		return nil, fmt.Errorf("--kube-api-content-type: want application/vnd.kubernetes.protobuf or application/json, got %q", o.kubeAPIContentType)
	}
	if o.configSyncPeriod < 0 {
		return nil, fmt.Errorf("--config-sync-period: must not be negative, got %v", o.configSyncPeriod)
	}
	if o.bindAddress, err = netip.ParseAddr(*bindAddress); err != nil {
		return nil, fmt.Errorf("--bind-address: want an IP address, got %q", *bindAddress)
	}
	if *masqBit < 0 || *masqBit > 31 {
		return nil, fmt.Errorf("--iptables-masquerade-bit: want 0-31, got %d", *masqBit)
	}
	o.masqueradeMark = 1 << *masqBit
	if !slices.Contains(config.IPVSSchedulers, o.ipvsScheduler) {
		return nil, fmt.Errorf("--ipvs-scheduler: want one of %s, got %q", strings.Join(config.IPVSSchedulers, ", "), o.ipvsScheduler)
	}
	if set["oom-score-adj"] {
		if *oomScoreAdj < -1000 || *oomScoreAdj > 1000 {
			return nil, fmt.Errorf("--oom-score-adj: want -1000 to 1000, got %d", *oomScoreAdj)
		}
		o.oomScoreAdj = oomScoreAdj
	}
	if *maxPerCore < 0 || *maxPerCore > math.MaxInt32 {
		return nil, fmt.Errorf("--conntrack-max-per-core: want 0 to %d, got %d", math.MaxInt32, *maxPerCore)
	}
	if *ctMin < 0 || *ctMin > math.MaxInt32 {
		return nil, fmt.Errorf("--conntrack-min: want 0 to %d, got %d", math.MaxInt32, *ctMin)
	}
	o.conntrack.MaxPerCore, o.conntrack.Min, o.conntrack.UDP = *maxPerCore, *ctMin, o.udpIdleTimeout
	for _, t := range []struct {
		flag string
		d    time.Duration
	}{
		{"conntrack-tcp-timeout-established", o.conntrack.TCPEstablished},
		{"conntrack-tcp-timeout-close-wait", o.conntrack.TCPCloseWait},
		{"conntrack-udp-timeout", o.udpIdleTimeout},
		{"conntrack-udp-timeout-stream", o.conntrack.UDPStream},
		{"ipvs-tcp-timeout", o.ipvsTimeouts.TimeoutTCP},
		{"ipvs-tcpfin-timeout", o.ipvsTimeouts.TimeoutTCPFin},
		{"ipvs-udp-timeout", o.ipvsTimeouts.TimeoutUDP},
	} {
		if err := sysctl.CheckSeconds(t.d); err != nil {
			return nil, fmt.Errorf("--%s: %w", t.flag, err)
		}
	}
	if o.udpReceiveBuffer < 0 {
		return nil, fmt.Errorf("--udp-receive-buffer: must not be negative, got %d", o.udpReceiveBuffer)
	}
	switch o.offload = forwarder.Offload(*offload); o.offload {
	case forwarder.OffloadNone, forwarder.OffloadSockmap:
	default:
		return nil, fmt.Errorf("--offload: want %q or %q, got %q", forwarder.OffloadNone, forwarder.OffloadSockmap, *offload)
	}
	switch o.ioUring = forwarder.IOUring(*ioUring); o.ioUring {
	case forwarder.IOUringAuto, forwarder.IOUringOff:
	default:
		return nil, fmt.Errorf("--io-uring: want %q or %q, got %q", forwarder.IOUringAuto, forwarder.IOUringOff, *ioUring)
	}
	switch o.workerBalance = *workerBalance; o.workerBalance {
	case "on", "off":
	default:
		return nil, fmt.Errorf("--worker-balance: want on or off, got %q", *workerBalance)
	}
	if o.ipvsExcludeCIDRs, err = parsePrefixes(*ipvsExclude); err != nil {
		return nil, fmt.Errorf("--ipvs-exclude-cidrs: want comma-separated CIDRs: %w", err)
	}
	if o.clusterCIDRs, err = parsePrefixes(*clusterCIDRs); err != nil {
		return nil, fmt.Errorf("--cluster-cidr: %w", err)
	}
	// The kernel modes' rule (one pod range per family, none of them /0)
	// holds for every mode: steering and the forwarder's inside test read
	// the same flag and would otherwise take what a kernel mode refuses.
	if _, err := netfilter.ClusterCIDRs(o.clusterCIDRs); err != nil {
		return nil, fmt.Errorf("--cluster-cidr: %w", err)
	}
	if o.handoverSocket, err = handover.SocketPath(o.handoverSocket); err != nil {
		return nil, fmt.Errorf("--handover-socket: %w", err)
	}
	if o.steering != "none" && o.steering != "redirect" && o.steering != "local" {
		return nil, fmt.Errorf("--steering: want redirect, local or none, got %q", o.steering)
	}
	if o.steeringBackend, err = redirect.ParseBackend(*steeringBackend); err != nil {
		return nil, fmt.Errorf("--steering-backend: %w", err)
	}
	if *redirectPort == 0 || *redirectPort > 65535 {
		return nil, fmt.Errorf("--redirect-port: want 1-65535, got %d", *redirectPort)
	}
	o.redirectPort = uint16(*redirectPort)
	if strings.TrimSpace(*nodePortAddresses) == "primary" {
		o.nodePortPrimary = true
	} else if o.nodePortAddresses, err = parsePrefixes(*nodePortAddresses); err != nil {
		return nil, fmt.Errorf("--nodeport-addresses: want comma-separated CIDRs or 'primary': %w", err)
	}
	if o.dialTimeouts, err = parseDurations(*dialTimeouts); err != nil {
		return nil, fmt.Errorf("--dial-timeouts: %w", err)
	}
	m, err := strconv.ParseInt(*mark, 0, 64)
	if err != nil || m > 0xffffffff {
		return nil, fmt.Errorf("--mark: want a 32-bit number such as 0x80000, got %q", *mark)
	}
	o.mark = int(m)
	if m > 0 && uint32(m)&o.masqueradeMark != 0 {
		return nil, fmt.Errorf("--iptables-masquerade-bit: mark %#x overlaps --mark %#x (the forwarder's own connections)", o.masqueradeMark, m)
	}
	if m <= 0 {
		if o.steering == "redirect" {
			return nil, fmt.Errorf("--mark: --steering=redirect needs a mark, so the forwarder's own connections are not redirected")
		}
		o.mark = -1
	}
	if o.algorithm, err = lb.ParseAlgorithm(*algorithm); err != nil {
		return nil, fmt.Errorf("--algorithm: %w", err)
	}
	if err := o.setLogging(set, *logLevel, *verbosity, *logFormat, *loggingFormat); err != nil {
		return nil, err
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

// resolveSyncPeriods applies kube-proxy's per-mode sync period flags: the
// ipvs ones in the ipvs mode, the iptables ones otherwise. --sync-period
// and --min-sync-period, when given, win.
func (o *options) resolveSyncPeriods(set map[string]bool, iptSync, iptMinSync, ipvsSync, ipvsMinSync time.Duration) error {
	syncFlag, minFlag, sync, minSync := "iptables-sync-period", "iptables-min-sync-period", iptSync, iptMinSync
	if o.proxyMode == proxymode.IPVS {
		syncFlag, minFlag, sync, minSync = "ipvs-sync-period", "ipvs-min-sync-period", ipvsSync, ipvsMinSync
	}
	if set[syncFlag] && !set["sync-period"] {
		if sync <= 0 {
			return fmt.Errorf("--%s: must be positive, got %v", syncFlag, sync)
		}
		o.syncPeriod = sync
	}
	if set[minFlag] && !set["min-sync-period"] {
		o.minSyncPeriod = minSync
	}
	return nil
}

// setLogging sets the level from --log-level, else from kube-proxy's --v,
// and the format from --log-format, else from --logging-format.
func (o *options) setLogging(set map[string]bool, level string, v int, format, loggingFormat string) error {
	switch {
	case set["log-level"] || !set["v"]:
		if err := o.logLevel.Set(level); err != nil {
			return fmt.Errorf("--log-level: %w", err)
		}
	case v < 0:
		return fmt.Errorf("--v: want 0 or more, got %d", v)
	case v >= 4:
		o.logLevel = zapcore.DebugLevel
	default:
		o.logLevel = zapcore.InfoLevel
	}
	o.logFormat = format
	if set["logging-format"] && !set["log-format"] {
		switch loggingFormat {
		case "text":
			o.logFormat = "console"
		case "json":
			o.logFormat = "json"
		default:
			return fmt.Errorf("--logging-format: want text or json, got %q", loggingFormat)
		}
	}
	if o.logFormat != "console" && o.logFormat != "json" {
		return fmt.Errorf("--log-format: want console or json, got %q", o.logFormat)
	}
	return nil
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
		out = append(out, netfilter.UnmapPrefix(p)) // ::ffff:10.0.0.0/104 is 10.0.0.0/8, as every consumer reads it
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

// steerAddrs are the addresses --steering=redirect sends traffic to
// (redirect.Config.NodeIPs): the node's primary IPs (the Node's, or
// --bind-address), each only if it is one of local, this host's
// addresses; none without REDIRECT steering. A family without one is
// REDIRECTed, which drops pod traffic arriving on an interface with no
// address of that family (Calico's and Cilium's pod veths); the
// redirector warns about each such family it serves (which is not known
// yet here).
func (o *options) steerAddrs(node *corev1.Node, local []netip.Addr) []netip.Addr {
	if o.steering != "redirect" {
		return nil
	}
	var out []netip.Addr
	primary := kube.PrimaryIPs(node, o.bindAddress)
	for _, is4 := range []bool{true, false} {
		if i := slices.IndexFunc(primary, func(ip netip.Addr) bool {
			return ip.Is4() == is4 && ip.IsGlobalUnicast() && slices.Contains(local, ip)
		}); i >= 0 {
			out = append(out, primary[i])
		}
	}
	return out
}

// resolvePrimary turns --nodeport-addresses=primary into the node's primary
// IPs (/32, /128), as kube-proxy does once it has the Node. With none known
// (no Node, no --bind-address) NodePorts stay on every address, as
// kube-proxy's, and the returned warning says so.
func (o *options) resolvePrimary(node *corev1.Node) (warning string) {
	if !o.nodePortPrimary {
		return ""
	}
	o.nodePortAddresses = nil
	for _, ip := range kube.PrimaryIPs(node, o.bindAddress) {
		if !ip.IsLoopback() {
			o.nodePortAddresses = append(o.nodePortAddresses, netip.PrefixFrom(ip, ip.BitLen()))
		}
	}
	if len(o.nodePortAddresses) == 0 {
		return "nodePortAddresses primary: this node's primary IPs are unknown (no Node object with InternalIP or ExternalIP addresses, no --bind-address): NodePorts are served on every address"
	}
	return ""
}
