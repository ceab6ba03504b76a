package daemon

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/svcproxy/svcproxy/lb"
	"github.com/svcproxy/svcproxy/runner"
)

// TestKernelIPv6 reads the kernel's IPv6 state from a /proc laid out as
// Linux's.
func TestKernelIPv6(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("skipping: /proc is Linux's")
	}
	if err := kernelIPv6("/proc"); err != nil {
		t.Skipf("skipping: this machine has no IPv6 (%v), so none of the cases can pass", err)
	}
	for _, tc := range []struct {
		name        string
		ifInet6     bool
		disableIPv6 string // "": the sysctl is missing
		wantErr     string // "": IPv6 is on
	}{
		{"enabled", true, "0\n", ""},
		{"no IPv6 interfaces file: the kernel has no IPv6", false, "0\n", "the kernel has no IPv6"},
		{"disabled by sysctl", true, "1\n", "disable_ipv6 = 1"},
		{"no sysctl", true, "", "disable_ipv6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proc := t.TempDir()
			if tc.ifInet6 {
				write(t, filepath.Join(proc, "net/if_inet6"), "00000000000000000000000000000001 01 80 10 80       lo\n")
			}
			if tc.disableIPv6 != "" {
				write(t, filepath.Join(proc, "sys/net/ipv6/conf/all/disable_ipv6"), tc.disableIPv6)
			}
			err := kernelIPv6(proc)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("kernelIPv6 = %v, want IPv6 on", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("kernelIPv6 = %v, want an error saying %q", err, tc.wantErr)
			}
		})
	}
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestUnservedIPv6Warning: on a node without IPv6, each Service with IPv6
// addresses is named in one warning when it appears, whatever its number
// of ports or of syncs; one that leaves and comes back is named again.
func TestUnservedIPv6Warning(t *testing.T) {
	svc := func(name, port string, clusterIPs, externalIPs []string) lb.Service {
		s := lb.Service{Name: lb.ServicePortName{Namespace: "e2e", Name: name, Port: port}, Port: 80,
			Endpoints: []lb.Endpoint{{Addr: netip.MustParseAddrPort("198.18.2.1:8080"), Ready: true, Serving: true}}}
		if port == "https" {
			s.Port = 443
		}
		for _, ip := range clusterIPs {
			s.ClusterIPs = append(s.ClusterIPs, netip.MustParseAddr(ip))
		}
		for _, ip := range externalIPs {
			s.ExternalIPs = append(s.ExternalIPs, netip.MustParseAddr(ip))
		}
		return s
	}
	v4only := svc("v4", "", []string{"198.19.0.9"}, nil)
	web := []lb.Service{
		svc("web", "http", []string{"198.19.0.10", "fd00:19::10"}, nil),
		svc("web", "https", []string{"198.19.0.10", "fd00:19::10"}, nil),
	}
	ext := svc("ext", "", []string{"198.19.0.11"}, []string{"fd00:19::20"})

	reason := errors.New("IPv6 is disabled (net.ipv6.conf.all.disable_ipv6 = 1)")
	core, logs := observer.New(zap.WarnLevel)
	u := newUnservedIPv6(reason, zap.New(core))
	store := lb.NewStore(lb.StoreOptions{})
	var snap *lb.Snapshot
	for _, step := range []struct {
		name     string
		services []lb.Service // nil: sync the last snapshot again
		want     map[string]string
	}{
		{"a dual-stack Service with two ports", append([]lb.Service{v4only}, web...), map[string]string{"e2e/web": "fd00:19::10"}},
		{"the same snapshot synced again", nil, nil},
		{"a new snapshot with the same Services", append([]lb.Service{v4only}, web...), nil},
		{"an ExternalIP-only IPv6 Service joins", append([]lb.Service{v4only, ext}, web...), map[string]string{"e2e/ext": "fd00:19::20"}},
		{"web leaves", []lb.Service{v4only, ext}, nil},
		{"web comes back", append([]lb.Service{v4only, ext}, web...), map[string]string{"e2e/web": "fd00:19::10"}},
	} {
		if step.services != nil {
			var err error
			if snap, err = store.Replace(step.services); err != nil {
				t.Fatal(err)
			}
		}
		u.check(snap)
		got := map[string]string{}
		for _, e := range logs.TakeAll() {
			fields := e.ContextMap()
			name, _ := fields["service"].(string)
			got[name] = strings.Join(anyStrings(fields["addresses"]), ",")
			if !strings.Contains(e.Message, "not served") || fields["reason"] != reason.Error() {
				t.Errorf("%s: warning %q %v does not say the IPv6 addresses are not served, and why", step.name, e.Message, fields)
			}
		}
		if len(got) != len(step.want) {
			t.Errorf("%s: warned about %v, want %v", step.name, got, step.want)
			continue
		}
		for name, addrs := range step.want {
			if got[name] != addrs {
				t.Errorf("%s: warning for %s names %q, want %q (all of %v)", step.name, name, got[name], addrs, got)
			}
		}
	}

	if newUnservedIPv6(nil, zap.NewNop()) != nil {
		t.Error("a node serving IPv6 warns about unserved IPv6 addresses")
	}
	(*unservedIPv6)(nil).check(snap) // the node serves IPv6: nothing to do
}

func anyStrings(v any) []string {
	var out []string
	if vs, ok := v.([]any); ok {
		for _, x := range vs {
			s, _ := x.(string)
			out = append(out, s)
		}
	}
	return out
}

// TestFamilyLabels: the daemon's metrics carry ip_family="IPv6" exactly
// when the node serves IPv6 (cmd/svcproxy's TestIPv6Detection decides it).
func TestFamilyLabels(t *testing.T) {
	for _, ipv6 := range []bool{false, true} {
		want := []string{runner.IPv4}
		if ipv6 {
			want = append(want, runner.IPv6)
		}
		reg := prometheus.NewPedanticRegistry()
		newDaemonMetrics(reg, Families(ipv6))
		if got := labelValues(t, reg, "kubeproxy_sync_proxy_rules_last_timestamp_seconds", "ip_family"); !slices.Equal(got, want) {
			t.Errorf("IPv6 %v: ip_family label values %v, want %v", ipv6, got, want)
		}
	}
}

// labelValues gathers reg and returns the values label takes in metric.
func labelValues(t *testing.T, reg prometheus.Gatherer, metric, label string) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != metric {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label {
					out = append(out, lp.GetValue())
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// counterValue gathers reg and returns the unlabelled counter (or gauge)
// metric.
func counterValue(t *testing.T, reg prometheus.Gatherer, metric string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == metric && len(mf.GetMetric()) == 1 {
			if g := mf.GetMetric()[0].GetGauge(); g != nil {
				return g.GetValue()
			}
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", metric)
	return 0
}
