package main

import (
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/kernelmodes/ipvs"
	"github.com/svcproxy/svcproxy/sysctl/sysctltest"
)

// TestTune: which runs tune sets the conntrack section, and what
// --init-only loads and sets besides.
func TestTune(t *testing.T) {
	tests := []struct {
		name         string
		args         []string
		env          environment
		loaded       bool  // nf_conntrack's parameters exist
		ipvsErr      error // what loading ip_vs returns
		wantTuned    bool  // the close-wait timeout set
		wantLoadCT   bool
		wantIPVS     bool // the IPVS parameters set
		wantWarnings int
		wantLoadIPVS bool
		wantARP      bool // arp_ignore and arp_announce set
		arpReadOnly  bool // writing them fails
	}{
		{name: "a static file on loopback: no NAT, nothing tuned", args: []string{"--services=x"}, loaded: true},
		{name: "REDIRECT steering", args: []string{"--services=x", "--steering=redirect"}, loaded: true, wantTuned: true},
		{name: "local steering", args: []string{"--services=x", "--steering=local"}, loaded: true, wantTuned: true},
		{name: "a kernel mode", args: []string{"--services=x", "--proxy-mode=iptables"}, loaded: true, wantTuned: true},
		{name: "the cluster's source: the Node's annotation may pick a kernel mode", args: []string{"--kubeconfig=k"}, loaded: true, wantTuned: true},
		{name: "the cluster's source, the userspace mode named, no steering", args: []string{"--kubeconfig=k", "--proxy-mode=userspace"}, loaded: true},
		{name: "--init-only tunes whatever the steering", args: []string{"--init-only"}, loaded: true, wantTuned: true},
		{name: "--init-only loads nf_conntrack first", args: []string{"--init-only"}, wantLoadCT: true, wantTuned: true},
		{name: "without --init-only nothing is loaded: each parameter is a warning", args: []string{"--services=x", "--steering=redirect"},
			wantWarnings: 3},
		{name: "--init-only with the IPVS mode", args: []string{"--init-only", "--proxy-mode=ipvs"}, loaded: true, wantTuned: true,
			wantLoadIPVS: true, wantIPVS: true},
		{name: "--init-only with the IPVS mode, no ip_vs", args: []string{"--init-only", "--proxy-mode=ipvs"}, loaded: true, wantTuned: true,
			ipvsErr: errors.New("no IPVS"), wantLoadIPVS: true, wantWarnings: 1},
		{name: "the IPVS mode's parameters are --init-only's alone", args: []string{"--services=x", "--proxy-mode=ipvs"}, loaded: true, wantTuned: true},
		{name: "strict ARP in the IPVS mode", args: []string{"--services=x", "--proxy-mode=ipvs", "--ipvs-strict-arp"}, loaded: true, wantTuned: true,
			wantARP: true},
		{name: "strict ARP with local steering", args: []string{"--services=x", "--steering=local", "--ipvs-strict-arp"}, loaded: true, wantTuned: true,
			wantARP: true},
		{name: "strict ARP with --init-only", args: []string{"--init-only", "--proxy-mode=ipvs", "--ipvs-strict-arp"}, loaded: true, wantTuned: true,
			wantLoadIPVS: true, wantIPVS: true, wantARP: true},
		{name: "strict ARP means nothing with REDIRECT steering", args: []string{"--services=x", "--steering=redirect", "--ipvs-strict-arp"}, loaded: true,
			wantTuned: true},
		{name: "no strict ARP unless asked", args: []string{"--services=x", "--proxy-mode=ipvs"}, loaded: true, wantTuned: true},
		{name: "strict ARP with a mode the Node's annotation is to pick", args: []string{"--kubeconfig=k", "--ipvs-strict-arp"}, loaded: true,
			wantTuned: true, wantARP: true},
		{name: "strict ARP refused: a warning each", args: []string{"--services=x", "--steering=local", "--ipvs-strict-arp"}, loaded: true,
			wantTuned: true, arpReadOnly: true, wantWarnings: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseFlags(tt.args, tt.env)
			if err != nil {
				t.Fatal(err)
			}
			ct := map[string]string{conntrack.MaxSysctl: "262144", conntrack.TCPEstablishedSysctl: "432000", conntrack.TCPCloseWaitSysctl: "60",
				"net/ipv4/conf/all/arp_ignore": "0", "net/ipv4/conf/all/arp_announce": "0", "net/ipv4/ip_forward": "0"}
			sysctls := sysctltest.NewParams(nil)
			if tt.loaded {
				sysctls = sysctltest.NewParams(ct)
			}
			if tt.arpReadOnly {
				sysctls.ReadOnly(syscall.EROFS, "net/ipv4/conf/all/arp_ignore", "net/ipv4/conf/all/arp_announce")
			}
			var loadedCT, loadedIPVS bool
			k := tuner{
				sysctls: sysctls, modules: sysctltest.NewParams(map[string]string{conntrack.HashsizeParam: "65536"}), cpus: 2,
				release: "4.18.0-553.el8_10.x86_64", // conn_reuse_mode is set there
				loadConntrack: func() error {
					loadedCT = true
					sysctls.Add(ct)
					return nil
				},
				loadIPVS: func() error {
					loadedIPVS = true
					if tt.ipvsErr == nil { // ip_vs's parameters appear, at the kernel's defaults
						sysctls.Add(map[string]string{"net/ipv4/vs/conntrack": "0", "net/ipv4/vs/expire_nodest_conn": "0", "net/ipv4/vs/expire_quiescent_template": "0", "net/ipv4/vs/conn_reuse_mode": "1"})
					}
					return tt.ipvsErr
				},
			}
			core, logs := observer.New(zapcore.DebugLevel)
			tune(o, k, zap.New(core))
			if got := sysctls.Values()[conntrack.TCPCloseWaitSysctl] == "3600"; got != tt.wantTuned {
				t.Errorf("tuned = %v, want %v (%v)", got, tt.wantTuned, sysctls.Values())
			}
			if loadedCT != tt.wantLoadCT || loadedIPVS != tt.wantLoadIPVS {
				t.Errorf("loaded nf_conntrack %v, ip_vs %v; want %v, %v", loadedCT, loadedIPVS, tt.wantLoadCT, tt.wantLoadIPVS)
			}
			if v := sysctls.Values(); (v["net/ipv4/vs/conntrack"] == "1" && v["net/ipv4/vs/conn_reuse_mode"] == "0" && v["net/ipv4/ip_forward"] == "1") != tt.wantIPVS {
				t.Errorf("IPVS parameters %v, want them set: %v", v, tt.wantIPVS)
			}
			if v := sysctls.Values(); (v["net/ipv4/conf/all/arp_ignore"] == "1" && v["net/ipv4/conf/all/arp_announce"] == "2") != tt.wantARP {
				t.Errorf("arp_ignore %s, arp_announce %s; want strict ARP %v", v["net/ipv4/conf/all/arp_ignore"], v["net/ipv4/conf/all/arp_announce"], tt.wantARP)
			}
			if n := logs.FilterLevelExact(zapcore.WarnLevel).Len(); n != tt.wantWarnings {
				t.Errorf("%d warnings, want %d: %v", n, tt.wantWarnings, logs.All())
			}
		})
	}
}

func TestCountCPUList(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int
	}{
		{"0\n", 1},
		{"0-1\n", 2},
		{"0-3,8,10-11\n", 7},
		{"0-63", 64},
		{"", 0},
		{"a-b", 0},
		{"3-1", 0},
		{"0-1,", 0},
		{"-1", 0},
	} {
		if got := countCPUList(tt.in); got != tt.want {
			t.Errorf("countCPUList(%q) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

func FuzzCountCPUList(f *testing.F) {
	for _, s := range []string{"0-3,8,10-11\n", "0", "", "7-2", "1,,2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if n := countCPUList(s); n < 0 {
			t.Errorf("countCPUList(%q) = %d", s, n)
		}
	})
}

// TestWriteConfigConntrack: the conntrack section, strict ARP, the IPVS
// timeouts and exclude CIDRs --write-config-to writes read back as the
// same.
func TestWriteConfigConntrack(t *testing.T) {
	o, err := parseFlags([]string{"--conntrack-max-per-core=0", "--conntrack-min=1000", "--conntrack-tcp-timeout-established=48h",
		"--conntrack-tcp-timeout-close-wait=0", "--conntrack-tcp-be-liberal", "--conntrack-udp-timeout=40s", "--conntrack-udp-timeout-stream=3m", "--ipvs-strict-arp",
		"--ipvs-tcp-timeout=2h", "--ipvs-udp-timeout=15s", "--ipvs-exclude-cidrs=192.0.2.0/24"}, outsidePod)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := writeConfig(o, path); err != nil {
		t.Fatal(err)
	}
	back, err := parseFlags([]string{"--config=" + path}, outsidePod)
	if err != nil {
		t.Fatal(err)
	}
	want := conntrack.Tuning{Min: 1000, TCPEstablished: 48 * time.Hour, TCPBeLiberal: true, UDP: 40 * time.Second, UDPStream: 3 * time.Minute}
	if back.conntrack != want || o.conntrack != want {
		t.Errorf("conntrack tuning: flags %+v, read back %+v, want %+v", o.conntrack, back.conntrack, want)
	}
	if !o.strictARP || !back.strictARP {
		t.Errorf("strict ARP: flags %v, read back %v, want true", o.strictARP, back.strictARP)
	}
	if wantT := (ipvs.Timeouts{TimeoutTCP: 2 * time.Hour, TimeoutUDP: 15 * time.Second}); back.ipvsTimeouts != wantT || o.ipvsTimeouts != wantT {
		t.Errorf("IPVS timeouts: flags %+v, read back %+v, want %+v", o.ipvsTimeouts, back.ipvsTimeouts, wantT)
	}
	if wantX := []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}; !slices.Equal(back.ipvsExcludeCIDRs, wantX) {
		t.Errorf("IPVS exclude CIDRs read back %v, want %v", back.ipvsExcludeCIDRs, wantX)
	}
}
