package main

import (
	"bytes"
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/forwarder"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/proxymode"
	"github.com/svcproxy/svcproxy/redirect"
)

var outsidePod = environment{}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     environment
		wantErr string // empty: no error
	}{
		{"defaults", nil, outsidePod, ""},
		{"redirect steering", []string{"--steering=redirect"}, outsidePod, ""},
		{"local steering", []string{"--steering=local"}, outsidePod, ""},
		{"local steering needs no mark", []string{"--steering=local", "--mark=0"}, outsidePod, ""},
		{"unknown steering", []string{"--steering=tproxy"}, outsidePod, "--steering"},
		{"steering backend", []string{"--steering=redirect", "--steering-backend=iptables"}, outsidePod, ""},
		{"unknown steering backend", []string{"--steering=redirect", "--steering-backend=ebpf"}, outsidePod, "--steering-backend"},
		{"unknown mode", []string{"--proxy-mode=ebpf"}, outsidePod, "--proxy-mode"},
		{"redirect needs a mark", []string{"--steering=redirect", "--mark=0"}, outsidePod, "--mark"},
		{"bad mark", []string{"--mark=zebra"}, outsidePod, "--mark"},
		{"bad dial timeouts", []string{"--dial-timeouts=250ms,-1s"}, outsidePod, "--dial-timeouts"},
		{"too many attempts", []string{"--dial-timeouts=" + strings.Repeat("1s,", 16) + "1s"}, outsidePod, "--dial-timeouts"},
		{"bad nodeport addresses", []string{"--nodeport-addresses=10.0.0.0/33"}, outsidePod, "--nodeport-addresses"},
		{"primary nodeport addresses", []string{"--nodeport-addresses=primary"}, outsidePod, ""},
		{"dual-stack cluster CIDRs", []string{"--cluster-cidr=10.244.0.0/16,fd00:244::/56"}, outsidePod, ""},
		{"two IPv4 cluster CIDRs", []string{"--cluster-cidr=10.244.0.0/16,10.96.0.0/12"}, outsidePod, "--cluster-cidr: clusterCIDRs: more than one IPv4 range"},
		{"an IPv4 cluster CIDR twice, once mapped", []string{"--cluster-cidr=10.244.0.0/16,::ffff:10.244.0.0/112"}, outsidePod, "--cluster-cidr: clusterCIDRs: more than one IPv4 range"},
		{"every address as cluster CIDR", []string{"--cluster-cidr=0.0.0.0/0"}, outsidePod, "--cluster-cidr: clusterCIDRs[0]: 0.0.0.0/0 is not a pod range"},
		{"every address as cluster CIDR, in a redirect mode too", []string{"--proxy-mode=userspace", "--cluster-cidr=::/0"}, outsidePod, "--cluster-cidr"},
		{"profiling off loopback", []string{"--profiling-bind-address=0.0.0.0:6060"}, outsidePod, "--profiling-bind-address"},
		{"profiling on loopback", []string{"--profiling-bind-address=127.0.0.1:6060"}, outsidePod, ""},
		{"bad sample", []string{"--conn-log-sample=0"}, outsidePod, "--conn-log-sample"},
		{"negative UDP receive buffer", []string{"--udp-receive-buffer=-1"}, outsidePod, "--udp-receive-buffer: must not be negative"},
		{"unknown offload", []string{"--offload=xdp"}, outsidePod, `--offload: want "none" or "sockmap", got "xdp"`},
		{"unknown io-uring", []string{"--io-uring=on"}, outsidePod, `--io-uring: want "auto" or "off", got "on"`},
		{"min sync above sync", []string{"--sync-period=1s", "--min-sync-period=2s"}, outsidePod, "--min-sync-period"},
		{"stray argument", []string{"extra"}, outsidePod, "unexpected argument"},
		{"negative conntrack max per core", []string{"--conntrack-max-per-core=-1"}, outsidePod, "--conntrack-max-per-core: want 0 to 2147483647, got -1"},
		{"conntrack min past int32", []string{"--conntrack-min=2147483648"}, outsidePod, "--conntrack-min: want 0 to 2147483647"},
		{"sub-second conntrack timeout", []string{"--conntrack-tcp-timeout-close-wait=10ms"}, outsidePod, "--conntrack-tcp-timeout-close-wait: the kernel counts whole seconds"},
		{"negative udp timeout", []string{"--conntrack-udp-timeout=-1s"}, outsidePod, "--conntrack-udp-timeout: must not be negative"},
		{"bad IPVS exclude CIDRs", []string{"--ipvs-exclude-cidrs=10.0.0.0/8,10.0.0.1"}, outsidePod, "--ipvs-exclude-cidrs: want comma-separated CIDRs"},
		{"sub-second IPVS timeout", []string{"--ipvs-tcpfin-timeout=500ms"}, outsidePod, "--ipvs-tcpfin-timeout: the kernel counts whole seconds"},
		{"negative IPVS timeout", []string{"--ipvs-udp-timeout=-1s"}, outsidePod, "--ipvs-udp-timeout: must not be negative"},
		{"IPVS timeout past the kernel's", []string{"--ipvs-tcp-timeout=6000h"}, outsidePod, "--ipvs-tcp-timeout: the kernel takes at most"},
		{"conntrack timeout past the kernel's", []string{"--conntrack-tcp-timeout-established=8760h"}, outsidePod, "--conntrack-tcp-timeout-established: the kernel takes at most"},
		{"unknown flag", []string{"--bogus"}, outsidePod, "-bogus"},

		// kube-proxy's flags, as its manifests pass them.
		{"kube-proxy manifest", []string{"--v=2", "--feature-gates=Foo=true", "--kube-api-qps=20", "--kube-api-burst=40",
			"--kube-api-content-type=application/json", "--bind-address=0.0.0.0", "--oom-score-adj=-999", "--ipvs-strict-arp",
			"--conntrack-max-per-core=0", "--hostname-override=node-a", "--cluster-cidr=10.244.0.0/16", "--config-sync-period=5m",
			"--metrics-bind-address=0.0.0.0:10249", "--healthz-bind-address=0.0.0.0:10256", "--logging-format=json",
			"--iptables-masquerade-bit=15", "--iptables-sync-period=10s", "--master=https://10.0.0.1:6443"}, outsidePod, ""},
		{"bad verbosity", []string{"--v=-1"}, outsidePod, "--v"},
		{"bad qps", []string{"--kube-api-qps=-1"}, outsidePod, "--kube-api-qps"},
		{"bad burst", []string{"--kube-api-burst=-1"}, outsidePod, "--kube-api-burst"},
		{"bad content type", []string{"--kube-api-content-type=text/plain"}, outsidePod, "--kube-api-content-type"},
		{"bad bind address", []string{"--bind-address=node-a"}, outsidePod, "--bind-address"},
		{"bad masquerade bit", []string{"--iptables-masquerade-bit=32"}, outsidePod, "--iptables-masquerade-bit"},
		{"masquerade bit on the forwarder's mark", []string{"--iptables-masquerade-bit=19"}, outsidePod, "--iptables-masquerade-bit"},
		{"scheduler the ipvs mode lacks", []string{"--ipvs-scheduler=lblc"}, outsidePod, "--ipvs-scheduler"},
		{"bad oom score adj", []string{"--oom-score-adj=-1001"}, outsidePod, "--oom-score-adj"},
		{"bad logging format", []string{"--logging-format=xml"}, outsidePod, "--logging-format"},
		{"bad config sync period", []string{"--config-sync-period=-1s"}, outsidePod, "--config-sync-period"},
		{"bad iptables sync period", []string{"--iptables-sync-period=0s"}, outsidePod, "--iptables-sync-period"},

		// Safe defaults: a kernel mode needs a real source.
		{"iptables without a source", []string{"--proxy-mode=iptables"}, outsidePod, "no source of Services"},
		{"ipvs without a source", []string{"--proxy-mode=ipvs"}, outsidePod, "no source of Services"},
		{"nftables without a source", []string{"--proxy-mode=nftables"}, outsidePod, "no source of Services"},
		{"nftables with a services file", []string{"--proxy-mode=NFTables", "--services=x.yaml"}, outsidePod, ""},
		{"nftables in a pod", []string{"--proxy-mode=nftables"}, environment{inPod: true}, ""},
		{"nftables cleanup needs no source", []string{"--proxy-mode=nftables", "--cleanup"}, outsidePod, ""},
		{"iptables with a services file", []string{"--proxy-mode=iptables", "--services=x.yaml"}, outsidePod, ""},
		{"iptables with a kubeconfig", []string{"--proxy-mode=iptables", "--kubeconfig=k"}, outsidePod, ""},
		{"iptables with a master", []string{"--proxy-mode=iptables", "--master=https://10.0.0.1:6443"}, outsidePod, ""},
		{"iptables in a pod", []string{"--proxy-mode=iptables"}, environment{inPod: true}, ""},
		{"cleanup needs no source", []string{"--proxy-mode=iptables", "--cleanup"}, outsidePod, ""},
		{"writing the config needs no source", []string{"--proxy-mode=ipvs", "--write-config-to=-"}, outsidePod, ""},
		{"init-only needs no source", []string{"--proxy-mode=ipvs", "--init-only"}, outsidePod, ""},
		{"userspace without a source", []string{"--proxy-mode=userspace"}, outsidePod, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args, tc.env)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("parseFlags(%q): %v", tc.args, err)
				}
				if o.handoverSocket == "auto" || !strings.HasPrefix(o.handoverSocket, "/run/svcproxy/handover-") {
					t.Errorf("handover socket %q, want the per-namespace default", o.handoverSocket)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("parseFlags(%q) = %v, want an error naming %s", tc.args, err, tc.wantErr)
			}
		})
	}
}

// TestParseFlagsValues: what each kube-proxy flag sets.
func TestParseFlagsValues(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		env   environment
		check func(o *options) bool
	}{
		{"default log level", nil, outsidePod, func(o *options) bool { return o.logLevel == zapcore.InfoLevel }},
		{"--v=2 is info", []string{"--v=2"}, outsidePod, func(o *options) bool { return o.logLevel == zapcore.InfoLevel }},
		{"--v=4 is debug", []string{"--v=4"}, outsidePod, func(o *options) bool { return o.logLevel == zapcore.DebugLevel }},
		{"--log-level wins over --v", []string{"--v=4", "--log-level=warn"}, outsidePod, func(o *options) bool { return o.logLevel == zapcore.WarnLevel }},
		{"--logging-format=json", []string{"--logging-format=json"}, outsidePod, func(o *options) bool { return o.logFormat == "json" }},
		{"--log-format wins", []string{"--logging-format=json", "--log-format=console"}, outsidePod, func(o *options) bool { return o.logFormat == "console" }},
		{"kube API client", []string{"--kube-api-qps=20.5", "--kube-api-burst=40", "--kube-api-content-type=application/json", "--master=https://m:6443"}, outsidePod,
			func(o *options) bool {
				return o.kubeAPIQPS == 20.5 && o.kubeAPIBurst == 40 && o.kubeAPIContentType == "application/json" && o.master == "https://m:6443" && !o.inCluster
			}},
		{"kube API defaults", nil, outsidePod, func(o *options) bool {
			return o.kubeAPIQPS == 5 && o.kubeAPIBurst == 10 && o.kubeAPIContentType == "application/vnd.kubernetes.protobuf" && o.configSyncPeriod == 15*time.Minute
		}},
		{"config sync period", []string{"--config-sync-period=0s"}, outsidePod, func(o *options) bool { return o.configSyncPeriod == 0 }},
		{"steering backend default", nil, outsidePod, func(o *options) bool { return o.steeringBackend == redirect.BackendAuto }},
		{"steering backend to redirect.Config", []string{"--steering=redirect", "--steering-backend=nftables"}, outsidePod, func(o *options) bool {
			return o.steeringBackend == redirect.BackendNFTables && redirectConfig(o, zap.NewNop()).Backend == redirect.BackendNFTables
		}},
		{"masquerade bit", []string{"--iptables-masquerade-bit=15"}, outsidePod, func(o *options) bool { return o.masqueradeMark == 0x8000 }},
		{"masquerade bit default", nil, outsidePod, func(o *options) bool { return o.masqueradeMark == 0x4000 }},
		{"iptables sync period", []string{"--iptables-sync-period=10s", "--iptables-min-sync-period=1s"}, outsidePod,
			func(o *options) bool { return o.syncPeriod == 10*time.Second && o.minSyncPeriod == time.Second }},
		{"ipvs sync period in the ipvs mode", []string{"--proxy-mode=ipvs", "--services=x", "--ipvs-sync-period=20s", "--iptables-sync-period=10s"}, outsidePod,
			func(o *options) bool { return o.syncPeriod == 20*time.Second }},
		{"--sync-period wins", []string{"--iptables-sync-period=10s", "--sync-period=40s"}, outsidePod, func(o *options) bool { return o.syncPeriod == 40*time.Second }},
		{"bind address", []string{"--bind-address=10.0.0.9"}, outsidePod, func(o *options) bool { return o.bindAddress == netip.MustParseAddr("10.0.0.9") }},
		{"primary", []string{"--nodeport-addresses=primary"}, outsidePod, func(o *options) bool { return o.nodePortPrimary && o.nodePortAddresses == nil }},
		{"oom score adj unset", nil, outsidePod, func(o *options) bool { return o.oomScoreAdj == nil }},
		{"oom score adj", []string{"--oom-score-adj=-999"}, outsidePod, func(o *options) bool { return o.oomScoreAdj != nil && *o.oomScoreAdj == -999 }},
		{"udp timeout", []string{"--conntrack-udp-timeout=10s"}, outsidePod, func(o *options) bool {
			return o.udpIdleTimeout == 10*time.Second && o.conntrack.UDP == 10*time.Second
		}},
		{"conntrack tuning: kube-proxy's defaults", nil, outsidePod, func(o *options) bool { return o.conntrack == conntrack.DefaultTuning }},
		{"conntrack tuning flags", []string{"--conntrack-max-per-core=65536", "--conntrack-min=1", "--conntrack-tcp-timeout-established=0",
			"--conntrack-tcp-timeout-close-wait=30m", "--conntrack-tcp-be-liberal", "--conntrack-udp-timeout-stream=2m"}, outsidePod,
			func(o *options) bool {
				return o.conntrack == conntrack.Tuning{MaxPerCore: 65536, Min: 1, TCPCloseWait: 30 * time.Minute, TCPBeLiberal: true, UDPStream: 2 * time.Minute} &&
					len(o.warnings) == 0
			}},
		{"IPVS exclude CIDRs", []string{"--ipvs-exclude-cidrs=10.0.0.0/8, 192.0.2.7/32"}, outsidePod, func(o *options) bool {
			return slices.Equal(o.ipvsExcludeCIDRs, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32")})
		}},
		{"IPVS timeouts left alone by default", nil, outsidePod, func(o *options) bool { return o.ipvsTimeouts == ipvs.Timeouts{} }},
		{"IPVS timeouts", []string{"--ipvs-tcp-timeout=1h", "--ipvs-tcpfin-timeout=30s", "--ipvs-udp-timeout=1m"}, outsidePod, func(o *options) bool {
			return o.ipvsTimeouts == ipvs.Timeouts{TimeoutTCP: time.Hour, TimeoutTCPFin: 30 * time.Second, TimeoutUDP: time.Minute} && len(o.warnings) == 0
		}},
		{"udp receive buffer", []string{"--udp-receive-buffer=4194304"}, outsidePod, func(o *options) bool { return o.udpReceiveBuffer == 4<<20 }},
		{"offload default", nil, outsidePod, func(o *options) bool { return o.offload == forwarder.OffloadNone }},
		{"offload sockmap", []string{"--offload=sockmap"}, outsidePod, func(o *options) bool { return o.offload == forwarder.OffloadSockmap }},
		{"io-uring default", nil, outsidePod, func(o *options) bool { return o.ioUring == forwarder.IOUringAuto }},
		{"io-uring off", []string{"--io-uring=off"}, outsidePod, func(o *options) bool { return o.ioUring == forwarder.IOUringOff }},
		{"worker-balance default", nil, outsidePod, func(o *options) bool { return o.workerBalance == "on" }},
		{"worker-balance off", []string{"--worker-balance=off"}, outsidePod, func(o *options) bool { return o.workerBalance == "off" }},
		{"proxy name", []string{"--proxy-name=svcproxy-b"}, outsidePod, func(o *options) bool { return o.proxyName == "svcproxy-b" }},
		{"init only", []string{"--init-only"}, outsidePod, func(o *options) bool { return o.initOnly }},
		{"in a pod: the in-cluster config", nil, environment{inPod: true}, func(o *options) bool { return o.inCluster }},
		{"outside a pod: no cluster", nil, outsidePod, func(o *options) bool { return !o.inCluster }},
		{"in a pod with a services file", []string{"--services=x"}, environment{inPod: true}, func(o *options) bool { return !o.inCluster }},
		{"in a pod with a kubeconfig", []string{"--kubeconfig=k"}, environment{inPod: true}, func(o *options) bool { return !o.inCluster }},
		{"ignored flags warned about, by name", []string{"--feature-gates=A=true", "--pod-bridge-interface=cbr0", "--profiling", "--vmodule=x=2"}, outsidePod,
			func(o *options) bool {
				return len(o.warnings) == 4 && strings.HasPrefix(o.warnings[0], "--feature-gates:") && strings.HasPrefix(o.warnings[1], "--profiling:") &&
					strings.HasPrefix(o.warnings[2], "--pod-bridge-interface:") && strings.HasPrefix(o.warnings[3], "--vmodule:")
			}},
		{"no warnings by default", nil, outsidePod, func(o *options) bool { return len(o.warnings) == 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args, tc.env)
			if err != nil {
				t.Fatalf("parseFlags(%q): %v", tc.args, err)
			}
			if !tc.check(o) {
				t.Errorf("parseFlags(%q): %+v", tc.args, *o)
			}
		})
	}
}

// TestFlagErrorsOnce: a bad flag is one line with a hint, never the usage.
func TestFlagErrorsOnce(t *testing.T) {
	var help bytes.Buffer
	_, err := parseFlags([]string{"--nope=1"}, environment{stdout: &help})
	if err == nil || !errors.Is(err, errHint) {
		t.Fatalf("err = %v, want it to wrap errHint", err)
	}
	if msg := err.Error(); strings.Count(msg, "nope") != 1 || strings.Contains(msg, "Usage") || strings.Contains(msg, "\n") {
		t.Errorf("error %q: want the problem once, on one line, without the usage", msg)
	}
	if help.Len() != 0 {
		t.Errorf("a bad flag printed the help:\n%s", help.String())
	}
}

// TestHelp: --help goes to stdout, grouped, every flag once.
func TestHelp(t *testing.T) {
	var out bytes.Buffer
	_, err := parseFlags([]string{"--help"}, environment{stdout: &out})
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v, want flag.ErrHelp", err)
	}
	help := out.String()
	if want := "ipvs or nftables"; !strings.Contains(strings.Join(strings.Fields(help), " "), want) {
		t.Errorf("--proxy-mode's help does not list the nftables mode (%q)", want)
	}
	sections := []string{"\nConfiguration:\n", "\nSource of Services:\n", "\nProxy mode:\n", "\nUserspace proxy:\n", "\nProcess:\n", "\nkube-proxy flags accepted and ignored, each named in a startup warning:\n"}
	last := -1
	for _, s := range sections {
		i := strings.Index(help, s)
		if i <= last {
			t.Errorf("section %q missing or out of order", strings.TrimSpace(s))
		}
		last = i
	}
	listed := map[string]int{} // flags as the help lists them: "  --name type" or "  --a, --b, ..."
	for _, line := range strings.Split(help, "\n") {
		if !strings.HasPrefix(line, "  --") {
			continue
		}
		for _, item := range strings.Split(strings.TrimSpace(line), ", ") {
			listed[strings.TrimSuffix(strings.Fields(item)[0], ",")]++
		}
	}
	for _, name := range []string{"--version", "--kube-api-qps", "--proxy-name", "--v", "--feature-gates", "--nodeport-addresses", "--log-level", "--vmodule"} {
		if listed[name] != 1 {
			t.Errorf("%s listed %d times in the help, want once", name, listed[name])
		}
	}
	for name, n := range listed {
		if n != 1 {
			t.Errorf("%s listed %d times in the help", name, n)
		}
	}
	for _, line := range strings.Split(help, "\n") {
		if len(line) > 80 {
			t.Errorf("help line longer than 80 columns: %q", line)
		}
	}
}

// TestConfigFileFields: the file's fields reach the options, command-line
// flags win, and the decoder's warnings are kept for the log.
func TestConfigFileFields(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 10.0.0.9
mode: iptables
nodePortAddresses: [primary]
oomScoreAdj: -999
iptables: {masqueradeBit: 13, syncPeriod: 20s}
ipvs: {scheduler: mh, strictARP: true, tcpTimeout: 1m, tcpFinTimeout: 20s, udpTimeout: 2m, excludeCIDRs: [10.0.0.0/8]}
conntrack: {udpTimeout: 45s, maxPerCore: 0, tcpCloseWaitTimeout: 2h, tcpBeLiberal: true, udpStreamTimeout: 5m}
clientConnection: {kubeconfig: /k, qps: 30, burst: 60, contentType: application/json}
configSyncPeriod: 1m
svcproxy: {proxyName: svcproxy-b, steeringBackend: nftables, offload: sockmap, ioUring: "off", workerBalance: "off"}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := parseFlags([]string{"--config=" + path, "--kube-api-burst=70"}, outsidePod)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		field string
		ok    bool
	}{
		{"bindAddress", o.bindAddress == netip.MustParseAddr("10.0.0.9")},
		{"mode", o.proxyMode == proxymode.IPTables},
		{"nodePortAddresses", o.nodePortPrimary},
		{"oomScoreAdj", o.oomScoreAdj != nil && *o.oomScoreAdj == -999},
		{"iptables.masqueradeBit", o.masqueradeMark == 1<<13},
		{"iptables.syncPeriod", o.syncPeriod == 20*time.Second},
		{"ipvs.scheduler", o.ipvsScheduler == "mh"},
		{"conntrack.udpTimeout", o.udpIdleTimeout == 45*time.Second && o.conntrack.UDP == 45*time.Second},
		{"conntrack tuning (defaults where the file says nothing)", o.conntrack == conntrack.Tuning{MaxPerCore: 0, Min: 131072,
			TCPEstablished: 24 * time.Hour, TCPCloseWait: 2 * time.Hour, TCPBeLiberal: true, UDP: 45 * time.Second, UDPStream: 5 * time.Minute}},
		{"clientConnection.kubeconfig", o.kubeconfig == "/k" && !o.inCluster},
		{"clientConnection.qps", o.kubeAPIQPS == 30},
		{"clientConnection.burst (the flag wins)", o.kubeAPIBurst == 70},
		{"clientConnection.contentType", o.kubeAPIContentType == "application/json"},
		{"configSyncPeriod", o.configSyncPeriod == time.Minute},
		{"svcproxy.proxyName", o.proxyName == "svcproxy-b"},
		{"svcproxy.steeringBackend", o.steeringBackend == redirect.BackendNFTables},
		{"svcproxy.offload", o.offload == forwarder.OffloadSockmap},
		{"svcproxy.ioUring", o.ioUring == forwarder.IOUringOff},
		{"svcproxy.workerBalance", o.workerBalance == "off"},
		{"ipvs.strictARP", o.strictARP},
		{"ipvs timeouts", o.ipvsTimeouts == ipvs.Timeouts{TimeoutTCP: time.Minute, TimeoutTCPFin: 20 * time.Second, TimeoutUDP: 2 * time.Minute}},
		{"ipvs.excludeCIDRs", slices.Equal(o.ipvsExcludeCIDRs, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")})},
	} {
		if !c.ok {
			t.Errorf("%s not honoured: %+v", c.field, *o)
		}
	}
}

// TestResolvePrimary: nodePortAddresses primary becomes the node's primary
// IPs once the Node is known.
func TestResolvePrimary(t *testing.T) {
	node := &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: "node-a"},
		{Type: corev1.NodeInternalIP, Address: "10.0.0.5"},
		{Type: corev1.NodeInternalIP, Address: "fd00::5"},
	}}}
	loopback := &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}}}
	for _, tc := range []struct {
		name     string
		args     []string
		node     *corev1.Node
		want     []string
		wantWarn bool
	}{
		{"not primary: unchanged", []string{"--nodeport-addresses=10.0.0.0/8"}, node, []string{"10.0.0.0/8"}, false},
		{"primary from the Node", []string{"--nodeport-addresses=primary"}, node, []string{"10.0.0.5/32", "fd00::5/128"}, false},
		{"primary with --bind-address", []string{"--nodeport-addresses=primary", "--bind-address=10.0.0.9"}, node, []string{"10.0.0.9/32", "fd00::5/128"}, false},
		{"primary without a Node", []string{"--nodeport-addresses=primary"}, nil, nil, true},
		{"primary without a Node, with --bind-address", []string{"--nodeport-addresses=primary", "--bind-address=10.0.0.9"}, nil, []string{"10.0.0.9/32"}, false},
		{"loopback is no primary IP", []string{"--nodeport-addresses=primary"}, loopback, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args, outsidePod)
			if err != nil {
				t.Fatal(err)
			}
			warn := o.resolvePrimary(tc.node)
			var got []string
			for _, p := range o.nodePortAddresses {
				got = append(got, p.String())
			}
			if !slices.Equal(got, tc.want) || (warn != "") != tc.wantWarn {
				t.Errorf("nodePortAddresses %v, warning %q; want %v, warning %v", got, warn, tc.want, tc.wantWarn)
			}
		})
	}
}

// TestSteerAddrs: REDIRECT steering DNATs to the node's primary IPs
// that are this host's addresses.
func TestSteerAddrs(t *testing.T) {
	node := func(addrs ...string) *corev1.Node {
		n := &corev1.Node{}
		for _, a := range addrs {
			typ := corev1.NodeInternalIP
			if a == "203.0.113.7" {
				typ = corev1.NodeExternalIP
			}
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: typ, Address: a})
		}
		return n
	}
	host := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.0.0.9"),
		netip.MustParseAddr("::1"), netip.MustParseAddr("fd00::5"), netip.MustParseAddr("fe80::1")}
	for _, tc := range []struct {
		name string
		args []string
		node *corev1.Node
		want []string
	}{
		{"no steering", nil, node("10.0.0.5"), nil},
		{"local steering", []string{"--steering=local"}, node("10.0.0.5"), nil},
		{"both families", []string{"--steering=redirect"}, node("10.0.0.5", "fd00::5"), []string{"10.0.0.5", "fd00::5"}},
		{"--bind-address first", []string{"--steering=redirect", "--bind-address=10.0.0.9"}, node("10.0.0.5", "fd00::5"), []string{"10.0.0.9", "fd00::5"}},
		{"no Node, --bind-address", []string{"--steering=redirect", "--bind-address=10.0.0.9"}, nil, []string{"10.0.0.9"}},
		{"no IPv6 primary", []string{"--steering=redirect"}, node("10.0.0.5"), []string{"10.0.0.5"}},
		{"a primary IP that is not the host's (a cloud's public IP)", []string{"--steering=redirect"}, node("203.0.113.7"), nil},
		{"no Node", []string{"--steering=redirect"}, nil, nil},
		{"loopback is never one", []string{"--steering=redirect", "--bind-address=127.0.0.1"}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args, outsidePod)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, a := range o.steerAddrs(tc.node, host) {
				got = append(got, a.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("steer to %v, want %v", got, tc.want)
			}
		})
	}
}

// TestRestartOnNewSteerAddrs: with REDIRECT steering, a Node update that
// moves the address steering DNATs to asks once for a restart (again only
// after restartRetry); others ask for none, nor does any while the host's
// addresses cannot be read or the mode does not steer, and without
// REDIRECT steering nothing watches.
func TestRestartOnNewSteerAddrs(t *testing.T) {
	node := func(ip string) *corev1.Node {
		return &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}}}
	}
	local := []netip.Addr{netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.0.0.6")}
	for _, tc := range []struct {
		name      string
		args      []string
		updates   []*corev1.Node
		want      int   // restarts asked for
		localErr  error // reading the host's addresses fails
		notSteers bool  // the mode chosen does not steer (a kernel mode)
	}{
		{"unchanged", []string{"--steering=redirect"}, []*corev1.Node{node("10.0.0.5"), node("10.0.0.5")}, 0, nil, false},
		{"moved, then updated again", []string{"--steering=redirect"}, []*corev1.Node{node("10.0.0.5"), node("10.0.0.6"), node("10.0.0.6"), node("10.0.0.5")}, 1, nil, false},
		{"moved off this host", []string{"--steering=redirect"}, []*corev1.Node{node("192.0.2.1")}, 1, nil, false},
		{"--bind-address wins over the Node", []string{"--steering=redirect", "--bind-address=10.0.0.5"}, []*corev1.Node{node("10.0.0.6")}, 0, nil, false},
		{"the host's addresses cannot be read", []string{"--steering=redirect"}, []*corev1.Node{node("10.0.0.6")}, 0, errors.New("netlink: EPERM"), false},
		{"a kernel mode runs", []string{"--steering=redirect"}, []*corev1.Node{node("10.0.0.6")}, 0, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args, outsidePod)
			if err != nil {
				t.Fatal(err)
			}
			o.steerTo = o.steerAddrs(node("10.0.0.5"), local)
			if !tc.notSteers {
				o.steeredBy = redirect.BackendIPTables // as the userspace mode records it
			}
			asked := 0
			onNode := restartOnNewSteerAddrs(o, zap.NewNop(), func() ([]netip.Addr, error) { return local, tc.localErr }, func() error { asked++; return errors.New("restarts are off") })
			for _, n := range tc.updates {
				onNode(n)
			}
			if asked != tc.want {
				t.Errorf("%d restarts asked for, want %d", asked, tc.want)
			}
		})
	}
	o, _ := parseFlags([]string{"--steering=local"}, outsidePod)
	if restartOnNewSteerAddrs(o, zap.NewNop(), nil, nil) != nil {
		t.Error("local steering watches the Node's addresses")
	}
}

// TestConfigFileNFTablesMode: mode: nftables in the file picks the nftables
// mode; a mode the file gets wrong is an error naming the field.
func TestConfigFileNFTablesMode(t *testing.T) {
	for _, tc := range []struct {
		mode, wantErr string
	}{
		{"nftables", ""},
		{"nft", `mode: want userspace, iptables, ipvs, nftables or empty, got "nft"`},
	} {
		path := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(path, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: "+tc.mode+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		o, err := parseFlags([]string{"--config=" + path}, outsidePod)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("mode: %s: err = %v, want %q", tc.mode, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("mode: %s: %v", tc.mode, err)
		}
		if o.proxyMode != proxymode.NFTables {
			t.Errorf("mode: %s: proxy mode %q, want nftables", tc.mode, o.proxyMode)
		}
	}
}

// TestParsePrefixes: CIDR flags are masked, and an IPv4-mapped prefix is
// its IPv4 one, so the forwarder, the steering and the kernel modes all
// read the same family and length.
func TestParsePrefixes(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"10.244.1.0/16", "10.244.0.0/16"},
		{"::ffff:10.244.0.0/112", "10.244.0.0/16"},
		{"fd00::1/48, 10.0.0.0/8", "fd00::/48,10.0.0.0/8"},
		{"", ""},
	} {
		got, err := parsePrefixes(tc.in)
		if err != nil {
			t.Fatalf("parsePrefixes(%q): %v", tc.in, err)
		}
		var s []string
		for _, p := range got {
			s = append(s, p.String())
		}
		if strings.Join(s, ",") != tc.want {
			t.Errorf("parsePrefixes(%q) = %v, want %s", tc.in, got, tc.want)
		}
	}
}
