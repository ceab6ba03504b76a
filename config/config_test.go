package config

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs/ipvstest"
)

const header = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name string
		yaml string
		want func(c *Config) // edits of Default
		warn []string        // substrings of warnings, in order
	}{
		{name: "header only: the defaults", yaml: header, want: func(*Config) {}},
		{
			name: "kube-proxy fields",
			yaml: header + `
bindAddress: 10.0.0.5
healthzBindAddress: 0.0.0.0:10266
metricsBindAddress: ""
mode: ipvs
hostnameOverride: node-a
nodePortAddresses: [10.0.0.0/8, "fd00::/64"]
clusterCIDR: 10.244.0.0/16,fd00:244::/56
iptables:
  masqueradeBit: 15
  masqueradeAll: true
  syncPeriod: 1m
  minSyncPeriod: 2s
ipvs:
  scheduler: mh
  syncPeriod: 45s
  minSyncPeriod: 500ms
conntrack:
  maxPerCore: 65536
  min: 262144
  tcpEstablishedTimeout: 48h
  tcpCloseWaitTimeout: 0s
  tcpBeLiberal: true
  udpTimeout: 1m30s
  udpStreamTimeout: 3m
oomScoreAdj: -999
clientConnection:
  kubeconfig: /var/lib/svcproxy/kubeconfig
  qps: 20.5
  burst: 40
  contentType: application/json
configSyncPeriod: 0s
`,
			want: func(c *Config) {
				bit := int32(15)
				c.BindAddress = "10.0.0.5"
				c.HealthzBindAddress = "0.0.0.0:10266"
				c.MetricsBindAddress = ""
				c.Mode = ModeIPVS
				c.HostnameOverride = "node-a"
				c.NodePortAddresses = []string{"10.0.0.0/8", "fd00::/64"}
				c.ClusterCIDR = "10.244.0.0/16,fd00:244::/56"
				c.IPTables = IPTables{MasqueradeBit: &bit, MasqueradeAll: true, SyncPeriod: Duration(time.Minute), MinSyncPeriod: Duration(2 * time.Second)}
				c.IPVS = IPVS{Scheduler: "mh", SyncPeriod: Duration(45 * time.Second), MinSyncPeriod: Duration(500 * time.Millisecond), ExcludeCIDRs: []string{}}
				c.Conntrack = Conntrack{MaxPerCore: 65536, Min: 262144, TCPEstablishedTimeout: Duration(48 * time.Hour),
					TCPBeLiberal: true, UDPTimeout: Duration(90 * time.Second), UDPStreamTimeout: Duration(3 * time.Minute)}
				adj := int32(-999)
				c.OOMScoreAdj = &adj
				c.ClientConnection = ClientConnection{Kubeconfig: "/var/lib/svcproxy/kubeconfig", QPS: 20.5, Burst: 40, ContentType: "application/json"}
				c.ConfigSyncPeriod = 0
			},
		},
		{
			name: "svcproxy section",
			yaml: header + `
svcproxy:
  steering: none
  steeringBackend: iptables
  redirectPort: 16001
  workers: 4
  dialTimeouts: [100ms, 1s]
  idleTimeout: -1s
  drainTimeout: 5s
  mark: 0x4000
  maxConns: 1000
  maxConnsPerService: 100
  algorithm: maglev
  connLog: "-"
  connLogSample: 10
  zone: zone-a
  proxyName: svcproxy
  handoverSocket: ""
`,
			want: func(c *Config) {
				c.Svcproxy = Svcproxy{Steering: "none", SteeringBackend: "iptables", RedirectPort: 16001, Workers: 4,
					DialTimeouts: []Duration{Duration(100 * time.Millisecond), Duration(time.Second)},
					IdleTimeout:  Duration(-time.Second), DrainTimeout: Duration(5 * time.Second), Mark: 0x4000,
					MaxConns: 1000, MaxConnsPerService: 100, Algorithm: "maglev", ConnLog: "-", ConnLogSample: 10,
					Zone: "zone-a", ProxyName: "svcproxy", HandoverSocket: ""}
			},
		},
		{
			name: "the nftables mode, its settings from the iptables section",
			yaml: header + "mode: nftables\niptables: {masqueradeAll: true, syncPeriod: 20s}\n",
			want: func(c *Config) {
				c.Mode = ModeNFTables
				c.IPTables.MasqueradeAll, c.IPTables.SyncPeriod = true, Duration(20*time.Second)
			},
		},
		{
			name: "nulls keep the defaults",
			yaml: header + "iptables:\nipvs: ~\nmode: null\n",
			want: func(*Config) {},
		},
		{
			// kubeadm writes kube-proxy's conntrack section with nulls: the defaults.
			name: "kubeadm's conntrack section",
			yaml: header + `
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
`,
			want: func(*Config) {},
		},
		{
			name: "a kube-proxy file with fields svcproxy ignores: warnings",
			yaml: header + `
featureGates: {Foo: true}
detectLocalMode: ClusterCIDR
nftables: {syncPeriod: 30s}
iptables: {localhostNodePorts: true}
conntrack: {maxPerCore: 0, udpTimeout: 10s}
ipvs: {strictARP: true, tcpTimeout: 10m, tcpFinTimeout: 30s, udpTimeout: 45s, excludeCIDRs: [10.0.0.0/8]}
`,
			want: func(c *Config) {
				c.Conntrack.MaxPerCore, c.Conntrack.UDPTimeout = 0, Duration(10*time.Second)
				c.IPVS.StrictARP = true
				c.IPVS.TCPTimeout, c.IPVS.TCPFinTimeout, c.IPVS.UDPTimeout = Duration(10*time.Minute), Duration(30*time.Second), Duration(45*time.Second)
				c.IPVS.ExcludeCIDRs = []string{"10.0.0.0/8"}
			},
			warn: []string{"line 4: featureGates: kube-proxy field ignored", "line 5: detectLocalMode", "line 6: nftables",
				"line 7: iptables.localhostNodePorts"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse([]byte(tc.yaml))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			want := Default()
			tc.want(want)
			warnings := got.Warnings
			got.Warnings = nil
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
			if len(warnings) != len(tc.warn) {
				t.Fatalf("warnings %q, want %d", warnings, len(tc.warn))
			}
			for i, w := range warnings {
				if !strings.Contains(w, tc.warn[i]) {
					t.Errorf("warning %d = %q, want it to contain %q", i, w, tc.warn[i])
				}
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		yaml string
		errs []string // each must appear in the error
	}{
		{"empty file", "", []string{"empty file"}},
		{"not YAML", "a: [", []string{"invalid configuration"}},
		{"two documents", header + "---\n" + header, []string{"more than one YAML document"}},
		{"no header", "mode: ipvs\n", []string{"apiVersion: want kubeproxy.config.k8s.io/v1alpha1", "kind: want KubeProxyConfiguration"}},
		{"wrong kind", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: Pod\n", []string{`kind: want KubeProxyConfiguration, got "Pod"`}},
		{"top level is a list", "- a\n", []string{"line 1: (top level): want a mapping"}},
		{"unknown top-level field", header + "mod: ipvs\n", []string{"line 3: mod: unknown field (known here: apiVersion,"}},
		{"unknown nested field", header + "iptables:\n  syncPeriods: 1s\n", []string{"line 4: iptables.syncPeriods: unknown field (known here: masqueradeAll, masqueradeBit, minSyncPeriod, syncPeriod)"}},
		{"unknown svcproxy field", header + "svcproxy: {redirectPorts: 1}\n", []string{"svcproxy.redirectPorts: unknown field"}},
		{"ignored name in the wrong place", header + "svcproxy: {featureGates: {}}\n", []string{"svcproxy.featureGates: unknown field"}},
		{"duplicate key", header + "mode: ipvs\nmode: iptables\n", []string{"line 4: mode: given more than once"}},
		{"bad duration", header + "iptables: {syncPeriod: 30}\n", []string{`line 3: iptables.syncPeriod: want a duration such as 30s or 1m30s, got "30"`}},
		{"bad mode", header + "mode: ebpf\n", []string{`mode: want userspace, iptables, ipvs, nftables or empty, got "ebpf"`}},
		{"number for a string", header + "hostnameOverride: 12\n", []string{"hostnameOverride: want a string"}},
		{"string for a number", header + "clientConnection: {burst: lots}\n", []string{`clientConnection.burst: want an integer (32 bits), got "lots"`}},
		{"port out of range", header + "svcproxy: {redirectPort: 70000}\n", []string{"svcproxy.redirectPort: want an integer in 0-65535"}},
		{"port zero", header + "svcproxy: {redirectPort: 0}\n", []string{"svcproxy.redirectPort: want 1-65535"}},
		{"list for a scalar", header + "mode: [ipvs]\n", []string{"mode: want a single value, got a list"}},
		{"scalar for a list", header + "nodePortAddresses: 10.0.0.0/8\n", []string{"nodePortAddresses: want a list"}},
		{"bad CIDR", header + "nodePortAddresses: [10.0.0.0/8, nope]\n", []string{`nodePortAddresses[1]: want a CIDR or "primary", got "nope"`}},
		{"primary with CIDRs", header + "nodePortAddresses: [primary, 10.0.0.0/8]\n", []string{`nodePortAddresses[0]: "primary" cannot be combined`}},
		{"bad clusterCIDR", header + "clusterCIDR: 10.0.0.0/8,x\n", []string{`clusterCIDR: want comma-separated CIDRs, got "x"`}},
		{"bad bind addresses", header + "bindAddress: x\nhealthzBindAddress: \"10256\"\nmetricsBindAddress: \"a:1\"\n", []string{`bindAddress: want an IP address, got "x"`, `healthzBindAddress: want IP:port`, `metricsBindAddress: want IP:port`}},
		{"masquerade bit", header + "iptables: {masqueradeBit: 32}\n", []string{"iptables.masqueradeBit: want 0-31, got 32"}},
		{"sync periods", header + "iptables: {syncPeriod: 0s, minSyncPeriod: -1s}\nipvs: {syncPeriod: 1s, minSyncPeriod: 2s}\n", []string{"iptables.syncPeriod: must be positive", "iptables.minSyncPeriod: must not be negative", "ipvs.minSyncPeriod: 2s is longer than syncPeriod 1s"}},
		{"scheduler", header + "ipvs: {scheduler: fancy}\n", []string{`ipvs.scheduler: the ipvs mode supports rr, wrr, lc, wlc, sh, dh, mh, got "fancy"`}},
		{"scheduler the kernel has but the ipvs mode does not", header + "ipvs: {scheduler: lblc}\n", []string{`ipvs.scheduler: the ipvs mode supports rr, wrr, lc, wlc, sh, dh, mh, got "lblc"`}},
		{"scheduler sed", header + "ipvs: {scheduler: sed}\n", []string{`ipvs.scheduler: the ipvs mode supports`}},
		{"oom score adj", header + "oomScoreAdj: -1001\n", []string{"oomScoreAdj: want -1000 to 1000, got -1001"}},
		{"negative udp timeout", header + "conntrack: {udpTimeout: -1s}\n", []string{"conntrack.udpTimeout: must not be negative"}},
		{"bad conntrack tuning", header + "conntrack: {maxPerCore: -1, min: -2, tcpEstablishedTimeout: 500ms, tcpCloseWaitTimeout: -1m, udpStreamTimeout: 1ms}\n", []string{
			"conntrack.maxPerCore: must not be negative, got -1", "conntrack.min: must not be negative, got -2",
			"conntrack.tcpEstablishedTimeout: the kernel counts whole seconds: want 0 (left alone) or at least 1s, got 500ms",
			"conntrack.tcpCloseWaitTimeout: must not be negative", "conntrack.udpStreamTimeout: the kernel counts whole seconds"}},
		{"bad IPVS exclude CIDRs", header + "ipvs: {excludeCIDRs: [10.0.0.0/8, 10.0.0.1]}\n", []string{`ipvs.excludeCIDRs[1]: want a CIDR, got "10.0.0.1"`}},
		{"bad IPVS timeouts", header + "ipvs: {tcpTimeout: -1s, tcpFinTimeout: 100ms, udpTimeout: 6000h}\n", []string{
			"ipvs.tcpTimeout: must not be negative", "ipvs.tcpFinTimeout: the kernel counts whole seconds", "ipvs.udpTimeout: the kernel takes at most 5965h13m56s, got 6000h0m0s"}},
		{"client connection", header + "clientConnection: {qps: -1, contentType: text/plain}\n", []string{"clientConnection.qps: must not be negative", "clientConnection.contentType: want"}},
		{"qps NaN", header + "clientConnection: {qps: .nan}\n", []string{"clientConnection.qps: want a number"}},
		{"svcproxy values", header + "svcproxy: {steering: tproxy, workers: -1, dialTimeouts: [], drainTimeout: -1s, maxConns: -1, maxConnsPerService: -2, algorithm: best, connLogSample: 0}\n",
			[]string{`svcproxy.steering: want redirect, local or none, got "tproxy"`, "svcproxy.workers: want 0-1024", "svcproxy.dialTimeouts: want 1 to 16 timeouts, got 0",
				"svcproxy.drainTimeout: must not be negative", "svcproxy.maxConns: must not be negative", "svcproxy.maxConnsPerService: must not be negative",
				`svcproxy.algorithm: unknown algorithm "best"`, "svcproxy.connLogSample: want 1 or more, got 0"}},
		{"steering backend", header + "svcproxy: {steeringBackend: bpf}\n", []string{`svcproxy.steeringBackend: want auto, nftables or iptables, got "bpf"`}},
		{"io_uring", header + "svcproxy: {ioUring: yes}\n", []string{`svcproxy.ioUring: want auto or off, got "yes"`}},
		{"worker balance", header + "svcproxy: {workerBalance: least}\n", []string{`svcproxy.workerBalance: want on or off, got "least"`}},
		{"dial timeout zero", header + "svcproxy: {dialTimeouts: [1s, 0s]}\n", []string{"svcproxy.dialTimeouts[1]: must be positive"}},
		{"redirect without mark", header + "svcproxy: {mark: 0}\n", []string{"svcproxy.mark: steering redirect needs a mark"}},
		{"alias", header + "iptables: &x {syncPeriod: 1s}\nipvs: *x\n", []string{"ipvs: YAML aliases are not supported"}},
		{"every problem at once", header + "mod: x\niptables: {syncPeriod: x}\nsvcproxy: {workers: x}\n", []string{"mod: unknown field", "iptables.syncPeriod: want a duration", "svcproxy.workers: want an integer"}},
		{"bad values beside ones that do not decode", header + "mode: ebpf\nsvcproxy: {steerng: redirect, workers: 5000}\n",
			[]string{"svcproxy.steerng: unknown field", "mode: ", "svcproxy.workers: want 0-1024"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.yaml))
			if err == nil {
				t.Fatalf("Parse accepted it: %+v", c)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error does not wrap ErrInvalid: %v", err)
			}
			for _, want := range tc.errs {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error:\n%v\nwant it to contain %q", err, want)
				}
			}
		})
	}
}

// TestWriteRoundTrip: what Write writes, Parse reads back the same, with
// every field present (a complete file, as --write-config-to promises).
func TestWriteRoundTrip(t *testing.T) {
	for name, c := range map[string]*Config{
		"defaults": Default(),
		"edited": func() *Config {
			c := Default()
			c.Mode, c.NodePortAddresses, c.HostnameOverride = ModeIPTables, []string{"10.0.0.0/8"}, "node-a"
			c.Svcproxy.DialTimeouts = []Duration{Duration(time.Second)}
			c.Svcproxy.Algorithm = "least-conn"
			c.IPTables.MasqueradeBit = nil
			return c
		}(),
	} {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := c.Write(&buf); err != nil {
				t.Fatal(err)
			}
			got, err := Parse(buf.Bytes())
			if err != nil {
				t.Fatalf("Parse(Write()): %v\n%s", err, buf.String())
			}
			want := *c
			if want.IPTables.MasqueradeBit == nil { // written as null: the default comes back
				want.IPTables.MasqueradeBit = Default().IPTables.MasqueradeBit
			}
			if !reflect.DeepEqual(got, &want) {
				t.Errorf("round trip:\n got %+v\nwant %+v\nfile:\n%s", got, &want, buf.String())
			}
			for _, field := range []string{"bindAddress:", "healthzBindAddress:", "metricsBindAddress:", "mode:", "hostnameOverride:",
				"nodePortAddresses:", "clusterCIDR:", "iptables:", "ipvs:", "conntrack:", "clientConnection:", "svcproxy:", "dialTimeouts:",
				"syncPeriod: 30s", "masqueradeAll:", "handoverSocket:"} {
				if !strings.Contains(buf.String(), field) {
					t.Errorf("written file lacks %q:\n%s", field, buf.String())
				}
			}
		})
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte(header+"mode: userspace\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil || c.Mode != ModeUserspace {
		t.Fatalf("Load = %+v, %v", c, err)
	}
	if err := os.WriteFile(path, []byte(header+"mode: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("Load of a bad file: %v, want an error naming the file", err)
	}
	if _, err := Load(filepath.Join(dir, "missing")); err == nil {
		t.Error("Load of a missing file succeeded")
	}
}

func TestAccessors(t *testing.T) {
	c := Default()
	if s, m := c.SyncPeriods(); s != 30*time.Second || m != time.Second {
		t.Errorf("userspace SyncPeriods = %v, %v; want the iptables section's 30s, 1s", s, m)
	}
	c.Mode = ModeIPVS
	c.IPVS.MinSyncPeriod = Duration(2 * time.Second)
	if s, m := c.SyncPeriods(); s != 30*time.Second || m != 2*time.Second {
		t.Errorf("ipvs SyncPeriods = %v, %v; want the ipvs section's", s, m)
	}
	c.Mode = ModeNFTables
	if s, m := c.SyncPeriods(); s != 30*time.Second || m != time.Second {
		t.Errorf("nftables SyncPeriods = %v, %v; want the iptables section's 30s, 1s", s, m)
	}
	c.NodePortAddresses = []string{"10.1.2.3/8", "fd00::1/64"}
	p, primary := c.NodePortPrefixes()
	if primary || len(p) != 2 || p[0].String() != "10.0.0.0/8" || p[1].String() != "fd00::/64" {
		t.Errorf("NodePortPrefixes = %v, %v", p, primary)
	}
	c.NodePortAddresses = []string{"primary"}
	if _, primary := c.NodePortPrefixes(); !primary {
		t.Error("primary not reported")
	}
	c.ClusterCIDR = "10.244.0.0/16, fd00::/56"
	if got := c.ClusterCIDRs(); len(got) != 2 {
		t.Errorf("ClusterCIDRs = %v", got)
	}
}

// FuzzParse: no input panics; whatever parses, validates, and survives a
// Write and Parse round trip unchanged.
func FuzzParse(f *testing.F) {
	f.Add([]byte(header))
	f.Add([]byte(header + "mode: ipvs\niptables: {syncPeriod: 1m, minSyncPeriod: 0s}\nsvcproxy: {dialTimeouts: [1s], workers: 3}\n"))
	f.Add([]byte(header + "nodePortAddresses: [primary]\nfeatureGates: {A: true}\n"))
	f.Add([]byte("a: &x [1]\nb: *x\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !strings.Contains(err.Error(), "empty") {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse returned a config that fails Validate: %v", err)
		}
		var buf bytes.Buffer
		if err := c.Write(&buf); err != nil {
			t.Fatal(err)
		}
		again, err := Parse(buf.Bytes())
		if err != nil {
			t.Fatalf("Parse(Write(c)): %v\n%s", err, buf.String())
		}
		c.Warnings, again.Warnings = nil, nil
		if c.IPTables.MasqueradeBit == nil {
			c.IPTables.MasqueradeBit = again.IPTables.MasqueradeBit
		}
		if !reflect.DeepEqual(c, again) {
			t.Fatalf("round trip changed it:\n%+v\n%+v", c, again)
		}
	})
}

// TestSchedulersAgreeWithTheIPVSMode: what validation accepts is what the
// ipvs mode runs, so no file passes validation and then fails at start.
func TestSchedulersAgreeWithTheIPVSMode(t *testing.T) {
	if !slices.Equal(IPVSSchedulers, ipvs.Schedulers) {
		t.Errorf("config.IPVSSchedulers = %v, ipvs.Schedulers = %v", IPVSSchedulers, ipvs.Schedulers)
	}
	for _, s := range ipvs.Schedulers {
		c := Default()
		c.IPVS.Scheduler = s
		if err := c.Validate(); err != nil {
			t.Errorf("scheduler %s: %v", s, err)
		}
		if _, err := ipvs.New(ipvstest.NewFakes(nil).Config(ipvs.Config{Scheduler: s})); err != nil {
			t.Errorf("scheduler %s: the ipvs mode refuses it: %v", s, err)
		}
	}
}
