// Package config owns svcproxy's configuration file: kube-proxy's
// KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1) where a field
// means the same, plus a svcproxy: section for what only svcproxy has.
//
//	apiVersion: kubeproxy.config.k8s.io/v1alpha1
//	kind: KubeProxyConfiguration
//	bindAddress: 0.0.0.0              # this node's primary IP of its family (for nodePortAddresses: [primary]); 0.0.0.0: from the Node
//	healthzBindAddress: 0.0.0.0:10256 # /healthz, /livez; "" off
//	metricsBindAddress: 127.0.0.1:10249
//	mode: ""                          # userspace | iptables | ipvs | nftables; "": the Node's annotation, else userspace
//	hostnameOverride: ""              # this node's name; "": the hostname
//	nodePortAddresses: []             # CIDRs, or [primary]: the Node's primary IPs; empty: every node address
//	oomScoreAdj: -999                 # unset: left as it is
//	clusterCIDR: ""                   # pod CIDRs, comma-separated
//	iptables: {masqueradeBit: 14, masqueradeAll: false, syncPeriod: 30s, minSyncPeriod: 1s}
//	ipvs: {scheduler: "", syncPeriod: 30s, minSyncPeriod: 0s, strictARP: false,   # scheduler: rr, wrr, lc, wlc, sh, dh, mh
//	       tcpTimeout: 0s, tcpFinTimeout: 0s, udpTimeout: 0s, excludeCIDRs: []}  # timeouts 0s: the kernel's
//	conntrack: {maxPerCore: 32768, min: 131072, tcpEstablishedTimeout: 24h, tcpCloseWaitTimeout: 1h, tcpBeLiberal: false, udpTimeout: 0s, udpStreamTimeout: 0s}
//	clientConnection: {kubeconfig: "", qps: 5, burst: 10, contentType: application/vnd.kubernetes.protobuf}
//	configSyncPeriod: 15m0s
//	svcproxy:
//	  steering: redirect
//	  steeringBackend: auto           # nftables | iptables (+ ipset) | auto: nftables when the kernel takes it
//	  redirectPort: 15001
//	  workers: 0
//	  dialTimeouts: [250ms, 500ms, 1s, 2s]
//	  proxyName: ""                   # serve only Services labelled service.kubernetes.io/service-proxy-name=<this>
//	  ...
//
// Decoding is strict: an unknown field, a value of the wrong type or out of
// range is an error naming the field path and line. kube-proxy fields that
// svcproxy has no use for (featureGates, nftables, winkernel, ...) are
// accepted with a warning, so a kube-proxy file moves over as it is (the
// nftables mode takes its settings from the iptables section).
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/sysctl"
)

// The file's type, as kube-proxy's.
const (
	APIVersion = "kubeproxy.config.k8s.io/v1alpha1"
	Kind       = "KubeProxyConfiguration"
)

// Proxy modes.
const (
	ModeUserspace = "userspace"
	ModeIPTables  = "iptables"
	ModeIPVS      = "ipvs"
	ModeNFTables  = "nftables"
)

// ErrInvalid wraps every error Parse and Validate return.
var ErrInvalid = errors.New("invalid configuration")

// Duration is a time.Duration written as Go writes it ("30s", "1m30s").
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// MarshalYAML writes d as a Go duration string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// Config is the whole file. Field comments give the defaults (Default).
type Config struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`

	// BindAddress overrides this node's primary IP of its family, as in
	// kube-proxy (the name is historical: nothing binds to it); it is what
	// nodePortAddresses: [primary] serves NodePorts on. Default 0.0.0.0:
	// the Node object's addresses.
	BindAddress string `yaml:"bindAddress"`
	// HealthzBindAddress is host:port of /healthz and /livez; "" turns them
	// off. Default 0.0.0.0:10256.
	HealthzBindAddress string `yaml:"healthzBindAddress"`
	// MetricsBindAddress is host:port of /metrics; "" turns it off.
	// Default 127.0.0.1:10249.
	MetricsBindAddress string `yaml:"metricsBindAddress"`
	// Mode is userspace, iptables, ipvs or nftables; "" (default): the Node's
	// net.experimental.kubernetes.io/proxy-mode annotation, else userspace.
	Mode string `yaml:"mode"`
	// HostnameOverride is this node's name; "" (default): the hostname.
	HostnameOverride string `yaml:"hostnameOverride"`
	// NodePortAddresses are CIDRs: NodePorts are served only on node
	// addresses inside them. The single value "primary" means the node's
	// primary IPs (one per family: the Node's first InternalIP, else
	// ExternalIP; BindAddress, if set, for its family). Empty (default):
	// every address.
	NodePortAddresses []string `yaml:"nodePortAddresses"`
	// OOMScoreAdj is the process's oom_score_adj, -1000 to 1000; unset
	// (default): left as it is.
	OOMScoreAdj *int32 `yaml:"oomScoreAdj"`
	// ClusterCIDR is the pods' CIDRs, comma-separated (one per family);
	// used to tell local traffic. Default "".
	ClusterCIDR string `yaml:"clusterCIDR"`

	IPTables         IPTables         `yaml:"iptables"`
	IPVS             IPVS             `yaml:"ipvs"`
	Conntrack        Conntrack        `yaml:"conntrack"`
	ClientConnection ClientConnection `yaml:"clientConnection"`
	// ConfigSyncPeriod is how often the informers resync from their cache.
	// Default 15m; 0: never.
	ConfigSyncPeriod Duration `yaml:"configSyncPeriod"`

	Svcproxy Svcproxy `yaml:"svcproxy"`

	// Warnings lists kube-proxy fields found in the file that svcproxy
	// ignores. Never written.
	Warnings []string `yaml:"-"`
}

// IPTables is kube-proxy's iptables section; the userspace mode's REDIRECT
// steering uses it too.
type IPTables struct {
	MasqueradeBit *int32   `yaml:"masqueradeBit"` // bit of the fwmark for SNAT, 0-31; default 14
	MasqueradeAll bool     `yaml:"masqueradeAll"` // iptables, nftables and ipvs modes: SNAT all traffic sent to ClusterIPs, as kube-proxy's; default false
	SyncPeriod    Duration `yaml:"syncPeriod"`    // longest time between full syncs; default 30s
	MinSyncPeriod Duration `yaml:"minSyncPeriod"` // shortest time between syncs; default 1s
}

// IPVS is kube-proxy's ipvs section.
type IPVS struct {
	Scheduler     string   `yaml:"scheduler"`     // one of IPVSSchedulers; "": rr
	SyncPeriod    Duration `yaml:"syncPeriod"`    // default 30s
	MinSyncPeriod Duration `yaml:"minSyncPeriod"` // default 0
	// StrictARP sets net.ipv4.conf.all.arp_ignore=1 and arp_announce=2 in
	// the IPVS mode and with local steering, whose virtual IPs are the
	// node's addresses on a dummy interface: the node then answers ARP for
	// them on no other interface. Default false.
	StrictARP bool `yaml:"strictARP"`
	// TCPTimeout, TCPFinTimeout and UDPTimeout are the node's IPVS
	// connection timeouts (ipvsadm --set), set by the ipvs mode: idle TCP,
	// TCP after a FIN, and UDP. Default 0: left as they are (the kernel's
	// 900s, 120s and 300s).
	TCPTimeout    Duration `yaml:"tcpTimeout"`
	TCPFinTimeout Duration `yaml:"tcpFinTimeout"`
	UDPTimeout    Duration `yaml:"udpTimeout"`
	// ExcludeCIDRs protect others' IPVS virtual servers on these
	// addresses (a keepalived's on a node IP): the ipvs mode leaves one
	// there alone unless its Services ask for it or the running process
	// created it. Default none.
	ExcludeCIDRs []string `yaml:"excludeCIDRs"`
}

// Conntrack is kube-proxy's conntrack section: the kernel's connection
// tracking, which svcproxy tunes at start as kube-proxy does
// (conntrack.Tune), except in the userspace mode with steering none.
type Conntrack struct {
	// MaxPerCore and Min size the table: nf_conntrack_max is raised to
	// max(MaxPerCore × CPUs, Min) if smaller, the nf_conntrack module's
	// hashsize to a quarter of that. Defaults 32768 and 131072;
	// MaxPerCore 0: the size is left alone.
	MaxPerCore int32 `yaml:"maxPerCore"`
	Min        int32 `yaml:"min"`
	// TCPEstablishedTimeout and TCPCloseWaitTimeout set
	// nf_conntrack_tcp_timeout_established and _close_wait; defaults 24h
	// and 1h; 0: left alone.
	TCPEstablishedTimeout Duration `yaml:"tcpEstablishedTimeout"`
	TCPCloseWaitTimeout   Duration `yaml:"tcpCloseWaitTimeout"`
	// TCPBeLiberal sets nf_conntrack_tcp_be_liberal; default false: left
	// alone.
	TCPBeLiberal bool `yaml:"tcpBeLiberal"`
	// UDPTimeout sets nf_conntrack_udp_timeout, and is how long an idle
	// UDP flow lives in the userspace proxy; 0 (default): the kernel's
	// left alone, and 30s in the proxy.
	UDPTimeout Duration `yaml:"udpTimeout"`
	// UDPStreamTimeout sets nf_conntrack_udp_timeout_stream; 0 (default):
	// left alone.
	UDPStreamTimeout Duration `yaml:"udpStreamTimeout"`
}

// ClientConnection is how svcproxy talks to the API server.
type ClientConnection struct {
	Kubeconfig  string  `yaml:"kubeconfig"`  // path; "" (default): in-cluster
	QPS         float32 `yaml:"qps"`         // default 5
	Burst       int32   `yaml:"burst"`       // default 10
	ContentType string  `yaml:"contentType"` // default application/vnd.kubernetes.protobuf
}

// Svcproxy is what only svcproxy has.
type Svcproxy struct {
	// Steering is how Service traffic reaches the userspace proxy: redirect
	// (REDIRECT rules), local (the virtual IPs on a dummy interface, the
	// forwarder listening on each frontend) or none (listen on each
	// frontend). Default redirect.
	Steering string `yaml:"steering"`
	// SteeringBackend is what writes redirect steering: nftables (one
	// owned table per family, over netlink), iptables (iptables + ipset)
	// or auto (nftables when the kernel takes the table, else iptables).
	// Default auto.
	SteeringBackend string `yaml:"steeringBackend"`
	// RedirectPort is the TCP port redirected connections arrive on.
	// Default 15001.
	RedirectPort uint16 `yaml:"redirectPort"`
	// Workers is SO_REUSEPORT listeners per address; 0 (default): GOMAXPROCS.
	Workers int `yaml:"workers"`
	// DialTimeouts is one connect timeout per attempt, each to a different
	// backend. Default [250ms, 500ms, 1s, 2s].
	DialTimeouts []Duration `yaml:"dialTimeouts"`
	// IdleTimeout closes connections idle both ways this long; negative:
	// never. Default 1h.
	IdleTimeout Duration `yaml:"idleTimeout"`
	// DrainTimeout is how long connections to a removed backend (and all at
	// shutdown) may continue. Default 30s.
	DrainTimeout Duration `yaml:"drainTimeout"`
	// Mark is SO_MARK of the proxy's upstream sockets; default 0x80000.
	Mark uint32 `yaml:"mark"`
	// MaxConns and MaxConnsPerService cap open connections; 0 (default): none.
	MaxConns           int64 `yaml:"maxConns"`
	MaxConnsPerService int64 `yaml:"maxConnsPerService"`
	// UDPReceiveBuffer is SO_RCVBUF of the userspace mode's UDP sockets,
	// in bytes; 0 (default): the kernel's net.core.rmem_default.
	UDPReceiveBuffer int `yaml:"udpReceiveBuffer"`
	// Offload moves established TCP connections' bytes in the kernel in
	// the userspace mode: none (default) or sockmap.
	Offload string `yaml:"offload"`
	// IOUring lets the userspace mode's event loop move small messages in
	// batches through io_uring: auto (default, where the kernel allows
	// it) or off.
	IOUring string `yaml:"ioUring"`
	// WorkerBalance hands a TCP connection the userspace mode accepted on
	// one worker to a worker with clearly fewer connections: on (default)
	// or off.
	WorkerBalance string `yaml:"workerBalance"`
	// MasterWorker runs a master process that keeps the sockets and
	// restarts the serving process (the worker) when it dies; default off.
	MasterWorker bool `yaml:"masterWorker"`
	// Algorithm is the default picker: round-robin (default), random,
	// least-conn or maglev.
	Algorithm string `yaml:"algorithm"`
	// ConnLog is the per-connection log file; "-": stdout; "": off.
	// Default /var/log/svcproxy/connections.log.
	ConnLog string `yaml:"connLog"`
	// ConnLogSample logs 1 in N successful connections. Default 1.
	ConnLogSample int `yaml:"connLogSample"`
	// Zone overrides the Node's topology.kubernetes.io/zone label.
	Zone string `yaml:"zone"`
	// HandoverSocket is the unix socket for zero-downtime restarts;
	// "auto" (default): one per network namespace; "": off.
	HandoverSocket string `yaml:"handoverSocket"`
	// ProxyName, if set, serves only Services labelled
	// service.kubernetes.io/service-proxy-name=<ProxyName>; "" (default):
	// only Services without that label.
	ProxyName string `yaml:"proxyName"`
}

// IPVSSchedulers are the schedulers the ipvs mode supports (its
// ipvs.Schedulers; a test keeps the two equal).
var IPVSSchedulers = []string{"rr", "wrr", "lc", "wlc", "sh", "dh", "mh"}

// Defaults shared with the command line.
const (
	DefaultHealthzBindAddress = "0.0.0.0:10256"
	DefaultMetricsBindAddress = "127.0.0.1:10249"
	DefaultRedirectPort       = 15001
	DefaultMark               = 0x80000
	DefaultConnLog            = "/var/log/svcproxy/connections.log"
)

// Default returns the configuration used for everything a file leaves out.
func Default() *Config {
	bit := int32(14)
	return &Config{
		APIVersion:         APIVersion,
		Kind:               Kind,
		BindAddress:        "0.0.0.0",
		HealthzBindAddress: DefaultHealthzBindAddress,
		MetricsBindAddress: DefaultMetricsBindAddress,
		NodePortAddresses:  []string{},
		IPTables:           IPTables{MasqueradeBit: &bit, SyncPeriod: Duration(30 * time.Second), MinSyncPeriod: Duration(time.Second)},
		IPVS:               IPVS{SyncPeriod: Duration(30 * time.Second), ExcludeCIDRs: []string{}},
		ClientConnection:   ClientConnection{QPS: 5, Burst: 10, ContentType: "application/vnd.kubernetes.protobuf"},
		Conntrack: Conntrack{MaxPerCore: 32 * 1024, Min: 128 * 1024,
			TCPEstablishedTimeout: Duration(24 * time.Hour), TCPCloseWaitTimeout: Duration(time.Hour)},
		ConfigSyncPeriod: Duration(15 * time.Minute),
		Svcproxy: Svcproxy{
			Steering:        "redirect",
			SteeringBackend: "auto",
			RedirectPort:    DefaultRedirectPort,
			DialTimeouts:    []Duration{Duration(250 * time.Millisecond), Duration(500 * time.Millisecond), Duration(time.Second), Duration(2 * time.Second)},
			IdleTimeout:     Duration(time.Hour),
			DrainTimeout:    Duration(30 * time.Second),
			Mark:            DefaultMark,
			Algorithm:       "round-robin",
			ConnLog:         DefaultConnLog,
			ConnLogSample:   1,
			HandoverSocket:  "auto",
		},
	}
}

// Load reads and parses the configuration file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading configuration: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Parse decodes a configuration file over Default and validates it. The
// error wraps ErrInvalid and lists every problem, each with its line and
// field path, e.g.
//
//	line 7: iptables.syncPeriod: time: invalid duration "30"
func Parse(data []byte) (*Config, error) {
	c := Default()
	c.APIVersion, c.Kind = "", "" // the file must say what it is
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: empty file (want apiVersion: %s, kind: %s)", ErrInvalid, APIVersion, Kind)
		}
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: more than one YAML document", ErrInvalid)
	}
	d := &decoder{}
	doc := &root
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		doc = doc.Content[0]
	}
	d.decode(doc, c, "")
	// The values that decoded are validated even when others did not, so
	// one pass lists every problem (a field that failed keeps its default).
	if errs := append(d.errs, c.problems()...); len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, errors.Join(errs...))
	}
	c.Warnings = d.warnings
	return c, nil
}

// Write writes c as a complete configuration file (for --write-config-to).
func (c *Config) Write(w io.Writer) error {
	out := *c
	out.APIVersion, out.Kind = APIVersion, Kind
	if out.NodePortAddresses == nil {
		out.NodePortAddresses = []string{}
	}
	if out.IPVS.ExcludeCIDRs == nil {
		out.IPVS.ExcludeCIDRs = []string{}
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&out); err != nil {
		return fmt.Errorf("writing configuration: %w", err)
	}
	return enc.Close()
}

// SyncPeriods returns the sync period and minimum sync period of c's mode:
// the ipvs section's for ipvs, the iptables section's otherwise (the
// userspace mode steers with iptables; the nftables mode, for which
// svcproxy reads no nftables section, uses the iptables one).
func (c *Config) SyncPeriods() (sync, minSync time.Duration) {
	if c.Mode == ModeIPVS {
		return c.IPVS.SyncPeriod.D(), c.IPVS.MinSyncPeriod.D()
	}
	return c.IPTables.SyncPeriod.D(), c.IPTables.MinSyncPeriod.D()
}

// NodePortPrefixes parses NodePortAddresses ("primary" is left out: the
// caller resolves it to the node's primary addresses).
func (c *Config) NodePortPrefixes() (prefixes []netip.Prefix, primary bool) {
	for _, s := range c.NodePortAddresses {
		if s == "primary" {
			primary = true
			continue
		}
		if p, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil {
			prefixes = append(prefixes, p.Masked())
		}
	}
	return prefixes, primary
}

// ClusterCIDRs parses ClusterCIDR.
func (c *Config) ClusterCIDRs() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range strings.Split(c.ClusterCIDR, ",") {
		if p, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// Validate reports every invalid value, each naming its field.
func (c *Config) Validate() error {
	errs := c.problems()
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalid, errors.Join(errs...))
}

// problems are Validate's findings, one per invalid value.
func (c *Config) problems() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if c.APIVersion != APIVersion {
		bad("apiVersion", "want %s, got %q", APIVersion, c.APIVersion)
	}
	if c.Kind != Kind {
		bad("kind", "want %s, got %q", Kind, c.Kind)
	}
	if c.BindAddress != "" {
		if _, err := netip.ParseAddr(c.BindAddress); err != nil {
			bad("bindAddress", "want an IP address, got %q", c.BindAddress)
		}
	}
	for field, addr := range map[string]string{"healthzBindAddress": c.HealthzBindAddress, "metricsBindAddress": c.MetricsBindAddress} {
		if addr == "" {
			continue
		}
		host, port, err := net.SplitHostPort(addr)
		if err == nil && host != "" {
			_, err = netip.ParseAddr(host)
		}
		if err == nil {
			var p uint64
			p, err = strconv.ParseUint(port, 10, 16)
			if err == nil && p == 0 {
				err = errors.New("port 0")
			}
		}
		if err != nil {
			bad(field, "want IP:port (e.g. 0.0.0.0:10256), got %q", addr)
		}
	}
	switch c.Mode {
	case "", ModeUserspace, ModeIPTables, ModeIPVS, ModeNFTables:
	default:
		bad("mode", "want userspace, iptables, ipvs, nftables or empty, got %q", c.Mode)
	}
	if len(c.HostnameOverride) > 253 {
		bad("hostnameOverride", "longer than 253 characters")
	}
	for i, s := range c.NodePortAddresses {
		if s == "primary" {
			if len(c.NodePortAddresses) > 1 {
				bad(fmt.Sprintf("nodePortAddresses[%d]", i), `"primary" cannot be combined with CIDRs`)
			}
			continue
		}
		if _, err := netip.ParsePrefix(s); err != nil {
			bad(fmt.Sprintf("nodePortAddresses[%d]", i), "want a CIDR or \"primary\", got %q", s)
		}
	}
	for i, s := range c.IPVS.ExcludeCIDRs {
		if _, err := netip.ParsePrefix(strings.TrimSpace(s)); err != nil {
			bad(fmt.Sprintf("ipvs.excludeCIDRs[%d]", i), "want a CIDR, got %q", s)
		}
	}
	if c.ClusterCIDR != "" {
		cidrs := strings.Split(c.ClusterCIDR, ",")
		if len(cidrs) > 2 {
			bad("clusterCIDR", "at most one CIDR per family, got %d", len(cidrs))
		}
		for _, s := range cidrs {
			if _, err := netip.ParsePrefix(strings.TrimSpace(s)); err != nil {
				bad("clusterCIDR", "want comma-separated CIDRs, got %q", s)
			}
		}
	}
	if b := c.IPTables.MasqueradeBit; b != nil && (*b < 0 || *b > 31) {
		bad("iptables.masqueradeBit", "want 0-31, got %d", *b)
	}
	periods := func(section string, sync, minSync Duration) {
		if sync <= 0 {
			bad(section+".syncPeriod", "must be positive, got %v", sync.D())
		}
		if minSync < 0 {
			bad(section+".minSyncPeriod", "must not be negative, got %v", minSync.D())
		} else if sync > 0 && minSync > sync {
			bad(section+".minSyncPeriod", "%v is longer than syncPeriod %v", minSync.D(), sync.D())
		}
	}
	periods("iptables", c.IPTables.SyncPeriod, c.IPTables.MinSyncPeriod)
	periods("ipvs", c.IPVS.SyncPeriod, c.IPVS.MinSyncPeriod)
	if c.IPVS.Scheduler != "" && !slices.Contains(IPVSSchedulers, c.IPVS.Scheduler) {
		bad("ipvs.scheduler", "the ipvs mode supports %s, got %q", strings.Join(IPVSSchedulers, ", "), c.IPVS.Scheduler)
	}
	if a := c.OOMScoreAdj; a != nil && (*a < -1000 || *a > 1000) {
		bad("oomScoreAdj", "want -1000 to 1000, got %d", *a)
	}
	if c.Conntrack.MaxPerCore < 0 {
		bad("conntrack.maxPerCore", "must not be negative, got %d", c.Conntrack.MaxPerCore)
	}
	if c.Conntrack.Min < 0 {
		bad("conntrack.min", "must not be negative, got %d", c.Conntrack.Min)
	}
	for _, t := range []struct {
		field string
		d     Duration
	}{
		{"conntrack.tcpEstablishedTimeout", c.Conntrack.TCPEstablishedTimeout},
		{"conntrack.tcpCloseWaitTimeout", c.Conntrack.TCPCloseWaitTimeout},
		{"conntrack.udpTimeout", c.Conntrack.UDPTimeout},
		{"conntrack.udpStreamTimeout", c.Conntrack.UDPStreamTimeout},
		{"ipvs.tcpTimeout", c.IPVS.TCPTimeout},
		{"ipvs.tcpFinTimeout", c.IPVS.TCPFinTimeout},
		{"ipvs.udpTimeout", c.IPVS.UDPTimeout},
	} {
		if err := sysctl.CheckSeconds(t.d.D()); err != nil {
			bad(t.field, "%v", err)
		}
	}
	if c.ClientConnection.QPS < 0 {
		bad("clientConnection.qps", "must not be negative, got %v", c.ClientConnection.QPS)
	}
	if c.ClientConnection.Burst < 0 {
		bad("clientConnection.burst", "must not be negative, got %d", c.ClientConnection.Burst)
	}
	switch c.ClientConnection.ContentType {
	case "", "application/json", "application/vnd.kubernetes.protobuf":
	default:
		bad("clientConnection.contentType", "want application/json or application/vnd.kubernetes.protobuf, got %q", c.ClientConnection.ContentType)
	}
	if c.ConfigSyncPeriod < 0 {
		bad("configSyncPeriod", "must not be negative, got %v", c.ConfigSyncPeriod.D())
	}

	s := &c.Svcproxy
	if s.Steering != "redirect" && s.Steering != "local" && s.Steering != "none" {
		bad("svcproxy.steering", "want redirect, local or none, got %q", s.Steering)
	}
	switch s.SteeringBackend {
	case "", "auto", "nftables", "iptables":
	default:
		bad("svcproxy.steeringBackend", "want auto, nftables or iptables, got %q", s.SteeringBackend)
	}
	if s.RedirectPort == 0 {
		bad("svcproxy.redirectPort", "want 1-65535")
	}
	if s.Workers < 0 || s.Workers > 1024 {
		bad("svcproxy.workers", "want 0-1024, got %d", s.Workers)
	}
	if len(s.DialTimeouts) == 0 || len(s.DialTimeouts) > lb.MaxAttempts {
		bad("svcproxy.dialTimeouts", "want 1 to %d timeouts, got %d", lb.MaxAttempts, len(s.DialTimeouts))
	}
	for i, d := range s.DialTimeouts {
		if d <= 0 {
			bad(fmt.Sprintf("svcproxy.dialTimeouts[%d]", i), "must be positive, got %v", d.D())
		}
	}
	if s.DrainTimeout < 0 {
		bad("svcproxy.drainTimeout", "must not be negative, got %v", s.DrainTimeout.D())
	}
	if s.Steering == "redirect" && s.Mark == 0 {
		bad("svcproxy.mark", "steering redirect needs a mark, so the proxy's own connections are not redirected")
	}
	if s.MaxConns < 0 {
		bad("svcproxy.maxConns", "must not be negative, got %d", s.MaxConns)
	}
	if s.MaxConnsPerService < 0 {
		bad("svcproxy.maxConnsPerService", "must not be negative, got %d", s.MaxConnsPerService)
	}
	if s.UDPReceiveBuffer < 0 {
		bad("svcproxy.udpReceiveBuffer", "must not be negative, got %d", s.UDPReceiveBuffer)
	}
	if s.Offload != "" && s.Offload != "none" && s.Offload != "sockmap" {
		bad("svcproxy.offload", "want none or sockmap, got %q", s.Offload)
	}
	if s.IOUring != "" && s.IOUring != "auto" && s.IOUring != "off" {
		bad("svcproxy.ioUring", "want auto or off, got %q", s.IOUring)
	}
	if s.WorkerBalance != "" && s.WorkerBalance != "on" && s.WorkerBalance != "off" {
		bad("svcproxy.workerBalance", "want on or off, got %q", s.WorkerBalance)
	}
	if _, err := lb.ParseAlgorithm(s.Algorithm); err != nil {
		bad("svcproxy.algorithm", "%v", err)
	}
	if s.ConnLogSample < 1 {
		bad("svcproxy.connLogSample", "want 1 or more, got %d", s.ConnLogSample)
	}
	return errs
}
