package conntrack_test

import (
	"maps"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/conntrack"
	"github.com/svcproxy/svcproxy/sysctl/sysctltest"
)

// kernel is a node's parameters as the kernel leaves them (2 CPUs, 24 GiB).
func kernel() (sysctls, modules map[string]string) {
	return map[string]string{
			conntrack.MaxSysctl:            "262144",
			conntrack.TCPEstablishedSysctl: "432000",
			conntrack.TCPCloseWaitSysctl:   "60",
			conntrack.TCPBeLiberalSysctl:   "0",
			conntrack.UDPSysctl:            "30",
			conntrack.UDPStreamSysctl:      "120",
		}, map[string]string{
			conntrack.HashsizeParam: "65536",
		}
}

func TestTune(t *testing.T) {
	tests := []struct {
		name            string
		t               conntrack.Tuning
		cpus            int
		edit            func(sysctls, modules map[string]string)
		readOnly        []string // sysctls whose writes fail
		readOnlyModules []string // module parameters whose writes fail
		wantSysctls     map[string]string
		wantModules     map[string]string
		wantChanged     []string
		wantErrs        []string
	}{
		{
			name: "kube-proxy's defaults on 2 CPUs: the table is big enough, the timeouts change",
			t:    conntrack.DefaultTuning, cpus: 2,
			wantSysctls: map[string]string{conntrack.TCPEstablishedSysctl: "86400", conntrack.TCPCloseWaitSysctl: "3600"},
			wantChanged: []string{
				"net/netfilter/nf_conntrack_tcp_timeout_established=86400 (was 432000)",
				"net/netfilter/nf_conntrack_tcp_timeout_close_wait=3600 (was 60)",
			},
		},
		{
			name: "kube-proxy's defaults on 16 CPUs: the table and its hash grow",
			t:    conntrack.DefaultTuning, cpus: 16,
			wantSysctls: map[string]string{conntrack.MaxSysctl: "524288", conntrack.TCPEstablishedSysctl: "86400", conntrack.TCPCloseWaitSysctl: "3600"},
			wantModules: map[string]string{conntrack.HashsizeParam: "131072"},
			wantChanged: []string{
				"net/netfilter/nf_conntrack_max=524288 (was 262144)",
				"nf_conntrack/parameters/hashsize=131072 (was 65536)",
				"net/netfilter/nf_conntrack_tcp_timeout_established=86400 (was 432000)",
				"net/netfilter/nf_conntrack_tcp_timeout_close_wait=3600 (was 60)",
			},
		},
		{
			name: "the minimum wins over a small per-CPU size; a smaller table is raised, a bigger hash kept",
			t:    conntrack.Tuning{MaxPerCore: 1000, Min: 300000}, cpus: 4,
			edit:        func(s, m map[string]string) { m[conntrack.HashsizeParam] = "100000" },
			wantSysctls: map[string]string{conntrack.MaxSysctl: "300000"},
			wantChanged: []string{"net/netfilter/nf_conntrack_max=300000 (was 262144)"},
		},
		{
			name: "a bigger table the node already has is kept (kube-proxy would lower it)",
			t:    conntrack.Tuning{MaxPerCore: 32768, Min: 131072}, cpus: 2,
			edit: func(s, m map[string]string) { s[conntrack.MaxSysctl] = "1048576"; m[conntrack.HashsizeParam] = "16384" },
			// The hash still gets a quarter of what was asked.
			wantModules: map[string]string{conntrack.HashsizeParam: "32768"},
			wantChanged: []string{"nf_conntrack/parameters/hashsize=32768 (was 16384)"},
		},
		{
			name: "a table without a limit keeps it",
			t:    conntrack.DefaultTuning, cpus: 16,
			edit:        func(s, m map[string]string) { s[conntrack.MaxSysctl] = "0" },
			wantSysctls: map[string]string{conntrack.TCPEstablishedSysctl: "86400", conntrack.TCPCloseWaitSysctl: "3600"},
			wantModules: map[string]string{conntrack.HashsizeParam: "131072"},
			wantChanged: []string{
				"nf_conntrack/parameters/hashsize=131072 (was 65536)",
				"net/netfilter/nf_conntrack_tcp_timeout_established=86400 (was 432000)",
				"net/netfilter/nf_conntrack_tcp_timeout_close_wait=3600 (was 60)",
			},
		},
		{
			name: "a value that is not a number is written over",
			t:    conntrack.Tuning{TCPCloseWait: time.Hour}, cpus: 2,
			edit:        func(s, m map[string]string) { s[conntrack.TCPCloseWaitSysctl] = "soon" },
			wantSysctls: map[string]string{conntrack.TCPCloseWaitSysctl: "3600"},
			wantChanged: []string{"net/netfilter/nf_conntrack_tcp_timeout_close_wait=3600 (was soon)"},
		},
		{
			name: "the hash table refused (not the node's first namespace): the table's size still grows",
			t:    conntrack.Tuning{MaxPerCore: 65536, Min: 1}, cpus: 8,
			readOnlyModules: []string{conntrack.HashsizeParam},
			wantSysctls:     map[string]string{conntrack.MaxSysctl: "524288"},
			wantChanged:     []string{"net/netfilter/nf_conntrack_max=524288 (was 262144)"},
			wantErrs:        []string{"setting nf_conntrack/parameters/hashsize to 131072 (it is 65536): open nf_conntrack/parameters/hashsize: operation not supported"},
		},
		{
			name: "every field; values already there are not written",
			t: conntrack.Tuning{TCPEstablished: 432000 * time.Second, TCPCloseWait: 90 * time.Second, UDP: 45 * time.Second,
				UDPStream: 3 * time.Minute, TCPBeLiberal: true},
			cpus:        2,
			wantSysctls: map[string]string{conntrack.TCPCloseWaitSysctl: "90", conntrack.UDPSysctl: "45", conntrack.UDPStreamSysctl: "180", conntrack.TCPBeLiberalSysctl: "1"},
			wantChanged: []string{
				"net/netfilter/nf_conntrack_tcp_timeout_close_wait=90 (was 60)",
				"net/netfilter/nf_conntrack_udp_timeout=45 (was 30)",
				"net/netfilter/nf_conntrack_udp_timeout_stream=180 (was 120)",
				"net/netfilter/nf_conntrack_tcp_be_liberal=1 (was 0)",
			},
		},
		{
			name: "nothing asked: nothing touched",
			t:    conntrack.Tuning{}, cpus: 64,
		},
		{
			name: "a timeout under a second is no timeout",
			t:    conntrack.Tuning{UDP: 500 * time.Millisecond}, cpus: 2,
		},
		{
			name: "read-only /proc/sys: every parameter that needs a write is named, the rest goes on",
			t:    conntrack.DefaultTuning, cpus: 16,
			readOnly:    []string{conntrack.MaxSysctl, conntrack.TCPCloseWaitSysctl},
			wantSysctls: map[string]string{conntrack.TCPEstablishedSysctl: "86400"},
			wantModules: map[string]string{conntrack.HashsizeParam: "131072"},
			wantChanged: []string{
				"nf_conntrack/parameters/hashsize=131072 (was 65536)",
				"net/netfilter/nf_conntrack_tcp_timeout_established=86400 (was 432000)",
			},
			wantErrs: []string{
				"setting net/netfilter/nf_conntrack_max to 524288 (it is 262144): open net/netfilter/nf_conntrack_max: read-only file system",
				"setting net/netfilter/nf_conntrack_tcp_timeout_close_wait to 3600 (it is 60): open net/netfilter/nf_conntrack_tcp_timeout_close_wait: read-only file system",
			},
		},
		{
			name: "a kernel without the parameter",
			t:    conntrack.Tuning{UDPStream: time.Minute}, cpus: 2,
			edit:     func(s, m map[string]string) { delete(s, conntrack.UDPStreamSysctl) },
			wantErrs: []string{"setting net/netfilter/nf_conntrack_udp_timeout_stream to 60: open net/netfilter/nf_conntrack_udp_timeout_stream: no such file or directory"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sysctls, modules := kernel()
			if tt.edit != nil {
				tt.edit(sysctls, modules)
			}
			wantSysctls, wantModules := maps.Clone(sysctls), maps.Clone(modules)
			maps.Copy(wantSysctls, tt.wantSysctls)
			maps.Copy(wantModules, tt.wantModules)
			s, m := sysctltest.NewParams(sysctls), sysctltest.NewParams(modules)
			s.ReadOnly(syscall.EROFS, tt.readOnly...)
			m.ReadOnly(syscall.EOPNOTSUPP, tt.readOnlyModules...)
			changed, failed := conntrack.Tune(tt.t, tt.cpus, s, m)
			if !slices.Equal(changed, tt.wantChanged) {
				t.Errorf("changed:\n got %q\nwant %q", changed, tt.wantChanged)
			}
			var errs []string
			for _, err := range failed {
				errs = append(errs, err.Error())
			}
			if !slices.Equal(errs, tt.wantErrs) {
				t.Errorf("errors:\n got %q\nwant %q", errs, tt.wantErrs)
			}
			for _, c := range []struct {
				what      string
				got, want map[string]string
			}{{"sysctls", s.Values(), wantSysctls}, {"module parameters", m.Values(), wantModules}} {
				for k, v := range c.want {
					if c.got[k] != v {
						t.Errorf("%s: %s = %q, want %q", c.what, k, c.got[k], v)
					}
				}
			}
		})
	}
}
