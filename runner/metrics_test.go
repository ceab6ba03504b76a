package runner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestMetricsRecordSyncs(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	type sync struct {
		full bool
		err  error
	}
	tests := []struct {
		name          string
		syncs         []sync
		wantLast      float64 // kubeproxy_ and svcproxy_ last timestamp: the last success
		wantFull      uint64  // full-sync histogram count
		wantPartial   uint64
		wantFailFull  float64
		wantFailPart  float64
		wantDurations uint64
	}{
		{"one full success", []sync{{true, nil}}, 1, 1, 0, 0, 0, 1},
		{"success then failure keeps the success time", []sync{{true, nil}, {false, errors.New("x")}}, 1, 1, 1, 0, 1, 2},
		{"failure first: no success time", []sync{{true, errors.New("x")}}, 0, 1, 0, 1, 0, 1},
		{"failure then retry succeeds", []sync{{false, errors.New("x")}, {true, nil}, {false, nil}}, 3, 1, 2, 0, 1, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			m := NewMetrics(reg, IPv4, IPv6)
			var wantLast float64
			for i, s := range tc.syncs {
				now := t0.Add(time.Duration(i+1) * time.Second)
				m.synced(s.full, 10*time.Millisecond, s.err, now)
			}
			if tc.wantLast != 0 {
				wantLast = seconds(t0.Add(time.Duration(tc.wantLast) * time.Second))
			}
			for _, fam := range []string{IPv4, IPv6} {
				if got := testutil.ToFloat64(m.lastSuccess.WithLabelValues(fam)); got != wantLast {
					t.Errorf("kubeproxy last timestamp %s = %v, want %v", fam, got, wantLast)
				}
				if got := histCount(t, reg, "kubeproxy_sync_full_proxy_rules_duration_seconds", fam); got != tc.wantFull {
					t.Errorf("full syncs %s = %d, want %d", fam, got, tc.wantFull)
				}
				if got := histCount(t, reg, "kubeproxy_sync_partial_proxy_rules_duration_seconds", fam); got != tc.wantPartial {
					t.Errorf("partial syncs %s = %d, want %d", fam, got, tc.wantPartial)
				}
				if got := histCount(t, reg, "kubeproxy_sync_proxy_rules_duration_seconds", fam); got != tc.wantDurations {
					t.Errorf("syncs %s = %d, want %d", fam, got, tc.wantDurations)
				}
			}
			if got := testutil.ToFloat64(m.ownLastSuccess); got != wantLast {
				t.Errorf("svcproxy last timestamp = %v, want %v", got, wantLast)
			}
			if got := testutil.ToFloat64(m.ownFailures.WithLabelValues("full")); got != tc.wantFailFull {
				t.Errorf("full failures = %v, want %v", got, tc.wantFailFull)
			}
			if got := testutil.ToFloat64(m.ownFailures.WithLabelValues("partial")); got != tc.wantFailPart {
				t.Errorf("partial failures = %v, want %v", got, tc.wantFailPart)
			}
			problems, err := testutil.GatherAndLint(reg)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range problems {
				// kube-proxy's own name for a gauge; kept for its dashboards.
				if p.Metric != "kubeproxy_sync_proxy_rules_no_local_endpoints_total" {
					t.Errorf("lint: %s: %s", p.Metric, p.Text)
				}
			}
		})
	}
}

// histCount returns the sample count of histogram name{ip_family=fam}.
func histCount(t *testing.T, g prometheus.Gatherer, name, fam string) uint64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "ip_family" && l.GetValue() == fam {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	t.Fatalf("%s{ip_family=%q} not found", name, fam)
	return 0
}

// TestMetricsNamesAndBuckets pins kube-proxy's names, labels and buckets:
// its dashboards query them by name.
func TestMetricsNamesAndBuckets(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	NewMetrics(reg)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range families {
		var labels []string
		for _, l := range f.GetMetric()[0].GetLabel() {
			labels = append(labels, l.GetName()+"="+l.GetValue())
		}
		got[f.GetName()] = strings.Join(labels, ",")
	}
	want := map[string]string{
		"kubeproxy_sync_proxy_rules_duration_seconds":              "ip_family=IPv4",
		"kubeproxy_sync_full_proxy_rules_duration_seconds":         "ip_family=IPv4",
		"kubeproxy_sync_partial_proxy_rules_duration_seconds":      "ip_family=IPv4",
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds":        "ip_family=IPv4",
		"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds": "ip_family=IPv4",
		"kubeproxy_network_programming_duration_seconds":           "ip_family=IPv4",
		"kubeproxy_sync_proxy_rules_no_local_endpoints_total":      "ip_family=IPv4,traffic_policy=external",
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending":      "",
		"kubeproxy_sync_proxy_rules_endpoint_changes_total":        "",
		"kubeproxy_sync_proxy_rules_service_changes_pending":       "",
		"kubeproxy_sync_proxy_rules_service_changes_total":         "",
		"svcproxy_sync_proxy_rules_duration_seconds":               "",
		"svcproxy_sync_proxy_rules_last_timestamp_seconds":         "",
		"svcproxy_sync_proxy_rules_failures_total":                 "type=full",
	}
	for name, labels := range want {
		if g, ok := got[name]; !ok {
			t.Errorf("%s missing", name)
		} else if g != labels {
			t.Errorf("%s labels = %q, want %q", name, g, labels)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %d metric families, want %d: %v", len(got), len(want), got)
	}
	b := programmingBuckets()
	if len(b) != 2+59+12+7 || b[0] != 0.25 || b[1] != 0.5 || b[2] != 1 || b[60] != 59 || b[61] != 60 || b[72] != 115 || b[73] != 120 || b[len(b)-1] != 300 {
		t.Errorf("network programming buckets = %v, want kube-proxy's", b)
	}
}

// TestRunnerRecordsOutcomes runs the loop with a sync that fails once: the
// failure is counted, the success timestamp moves only with the retry.
func TestRunnerRecordsOutcomes(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	var lastAtFailure float64 = -1
	l := startLoop(t, 0, 0, 1, func(r *Runner) {
		r.RetryInterval = 50 * time.Millisecond
		r.Metrics = m
		r.OnSync = func(full bool, took time.Duration, err error) {
			if err != nil {
				lastAtFailure = testutil.ToFloat64(m.lastSuccess.WithLabelValues(IPv4))
			}
		}
	})
	l.expect("the first sync, failing", true)
	l.waiters("the retry timer", 1)
	l.clk.Step(50 * time.Millisecond)
	l.expect("the retry", true)
	if lastAtFailure != 0 {
		t.Errorf("last timestamp after the failed first sync = %v, want 0", lastAtFailure)
	}
	if got, want := testutil.ToFloat64(m.ownLastSuccess), float64(l.clk.Now().UnixNano())/1e9; got != want {
		t.Errorf("own last success = %v, want the retry's time %v", got, want)
	}
	if got := testutil.ToFloat64(m.ownFailures.WithLabelValues("full")); got != 1 {
		t.Errorf("failures = %v, want 1", got)
	}
	if testutil.ToFloat64(m.lastQueued.WithLabelValues(IPv4)) == 0 {
		t.Error("last queued timestamp not set by Run")
	}
}

func TestTriggerSetsQueuedTimestamp(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry(), IPv4)
	r := New(func(context.Context, bool) error { return nil }, 0, 0)
	r.Metrics = m
	at := time.Unix(1_800_000_000, 500_000_000)
	r.Clock = clocktesting.NewFakeClock(at)
	r.Trigger()
	r.Trigger() // coalesced, still recorded
	if got := testutil.ToFloat64(m.lastQueued.WithLabelValues(IPv4)); got != 1_800_000_000.5 {
		t.Fatalf("last queued = %v, want 1800000000.5", got)
	}
}

// TestRunCancelledSyncNotAFailure: a sync cut short because Run's ctx
// ended (a handover or a shutdown stopping the syncs) is neither reported
// to OnSync nor counted as a failure.
func TestRunCancelledSyncNotAFailure(t *testing.T) {
	m := NewMetrics(prometheus.NewPedanticRegistry())
	started := make(chan struct{})
	r := New(func(ctx context.Context, full bool) error {
		close(started)
		<-ctx.Done()
		return fmt.Errorf("applying: %w", ctx.Err())
	}, 0, 0)
	r.Metrics = m
	var reported atomic.Int32
	r.OnSync = func(bool, time.Duration, error) { reported.Add(1) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	<-started
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of ctx ending")
	}
	if n := reported.Load(); n != 0 {
		t.Errorf("OnSync called %d times for the cancelled sync, want 0", n)
	}
	if got := testutil.ToFloat64(m.ownFailures.WithLabelValues("full")); got != 0 {
		t.Errorf("failures = %v, want 0", got)
	}
}
