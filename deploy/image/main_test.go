package main

import (
	"io"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--out", "bin/svcproxy-image.tar"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Name != "svcproxy" || o.Arch != runtime.GOARCH || o.Suite != "bookworm" || o.RootfsMaxAge != 7*24*time.Hour ||
		!strings.HasSuffix(o.CacheDir, "/svcproxy/rootfs") || o.ModuleDir != "." {
		t.Errorf("defaults: %+v", o)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string // in the error
	}{
		{"nothing to do", nil, "give --out, --push or both"},
		{"unknown architecture", []string{"--out", "x.tar", "--arch", "sparc"}, `--arch "sparc"`},
		{"bad name", []string{"--out", "x.tar", "--name", "Svc Proxy"}, `--name "Svc Proxy"`},
		{"bad push reference", []string{"--push", "https://registry.example/svcproxy"}, `--push "https://registry.example/svcproxy"`},
		{"negative age", []string{"--out", "x.tar", "--rootfs-max-age", "-1h"}, "--rootfs-max-age -1h0m0s"},
		{"stray argument", []string{"--out", "x.tar", "image"}, "unexpected arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := parseFlags(tc.args, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("parseFlags(%q): %v, want an error saying %q", tc.args, err, tc.want)
			}
		})
	}
}
