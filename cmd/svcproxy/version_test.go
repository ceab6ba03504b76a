package main

import (
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		want buildInfo
	}{
		{"no build info", nil, buildInfo{"unknown", "unknown", "unknown"}},
		{"from a checkout without VCS stamping", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			buildInfo{"(devel)", "unknown", "go1.26.8"}},
		{"a release", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "3a89d30"}, {Key: "vcs.modified", Value: "false"}}},
			buildInfo{"v1.2.3", "3a89d30", "go1.26.8"}},
		{"a modified tree", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "3a89d30"}, {Key: "vcs.modified", Value: "true"}}},
			buildInfo{"(devel)", "3a89d30-dirty", "go1.26.8"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := newBuildInfo(tc.bi); got != tc.want {
				t.Errorf("newBuildInfo = %+v, want %+v", got, tc.want)
			}
		})
	}
	if got := newBuildInfo(&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}}}).String(); got != "svcproxy v1.2.3 (commit abc, go1.26.8)" {
		t.Errorf("String() = %q", got)
	}
}

func TestBuildInfoLinkedRevision(t *testing.T) {
	stamped := buildInfo{"v1.2.3", "3a89d30", "go1.26.8"}
	unstamped := buildInfo{"(devel)", "unknown", "go1.26.8"}
	for _, tc := range []struct {
		name   string
		b      buildInfo
		linked string
		want   buildInfo
	}{
		{"Go's stamp wins", stamped, "ffffff", stamped},
		{"no stamp, linked", unstamped, "3a89d30-dirty", buildInfo{"(devel)", "3a89d30-dirty", "go1.26.8"}},
		{"no stamp, nothing linked", unstamped, "", unstamped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.b.withLinkedRevision(tc.linked); got != tc.want {
				t.Errorf("withLinkedRevision(%q) = %+v, want %+v", tc.linked, got, tc.want)
			}
		})
	}
}

func TestBuildInfoMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	registerBuildInfo(reg, buildInfo{Version: "v1.2.3", Revision: "abc", GoVersion: "go1.26.8"})
	want := `
# HELP svcproxy_build_info Always 1, labelled with the version, VCS revision and Go version svcproxy was built from.
# TYPE svcproxy_build_info gauge
svcproxy_build_info{goversion="go1.26.8",revision="abc",version="v1.2.3"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "svcproxy_build_info"); err != nil {
		t.Error(err)
	}
}
