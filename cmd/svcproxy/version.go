package main

import (
	"fmt"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// buildInfo is what --version prints and svcproxy_build_info exports.
type buildInfo struct {
	Version   string // the module version; "(devel)" for a build from a checkout
	Revision  string // the VCS commit, "-dirty" appended when modified; "unknown" without VCS stamping
	GoVersion string
}

// linkedRevision is the commit for builds Go cannot stamp, set with
// -ldflags "-X main.linkedRevision=<commit>[-dirty]" (deploy/image,
// deploy/Dockerfile): cmd/go stamps VCS information only where .git is a
// directory, so not in a git worktree nor in a build context without .git.
// Go's own stamp wins when there is one.
var linkedRevision string

// readBuildInfo reads the binary's own build information.
func readBuildInfo() buildInfo {
	bi, _ := debug.ReadBuildInfo()
	return newBuildInfo(bi).withLinkedRevision(linkedRevision)
}

// withLinkedRevision returns b with rev as its revision when Go stamped none.
func (b buildInfo) withLinkedRevision(rev string) buildInfo {
	if b.Revision == "unknown" && rev != "" {
		b.Revision = rev
	}
	return b
}

// newBuildInfo extracts buildInfo from bi (nil: a binary without it).
func newBuildInfo(bi *debug.BuildInfo) buildInfo {
	b := buildInfo{Version: "unknown", Revision: "unknown", GoVersion: "unknown"}
	if bi == nil {
		return b
	}
	if bi.Main.Version != "" {
		b.Version = bi.Main.Version
	}
	if bi.GoVersion != "" {
		b.GoVersion = bi.GoVersion
	}
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if modified && b.Revision != "unknown" {
		b.Revision += "-dirty"
	}
	return b
}

func (b buildInfo) String() string {
	return fmt.Sprintf("svcproxy %s (commit %s, %s)", b.Version, b.Revision, b.GoVersion)
}

// registerBuildInfo exports b as svcproxy_build_info, always 1, as
// kubernetes_build_info and Prometheus' own build_info gauges.
func registerBuildInfo(reg prometheus.Registerer, b buildInfo) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "svcproxy", Name: "build_info",
		Help:        "Always 1, labelled with the version, VCS revision and Go version svcproxy was built from.",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion},
	})
	g.Set(1)
	reg.MustRegister(g)
}
