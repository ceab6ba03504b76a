package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const (
	goodServices = `services:
  - name: web
    clusterIP: 127.0.0.1
    ports: [{port: 18080}]
    endpoints: [{ip: 127.0.0.1, ports: {"": 18081}}]
`
	// Two problems: an unknown key and port 0.
	badServices = `services:
  - name: web
    clusterIP: 127.0.0.1
    ports: [{port: 18080}]
    wieght: 2
  - name: db
    clusterIP: 127.0.0.2
    ports: [{port: 0}]
`
	goodConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
`
	// Two problems: an unknown field and a mode that does not exist.
	badConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: ebpf
svcproxy: {steerng: redirect}
`
)

var (
	badServicesProblems = []string{"line 5: services[0].wieght: unknown key", "line 8: services[1].ports[0].port: must be in 1-65535"}
	badConfigProblems   = []string{"svcproxy.steerng", "mode"}
)

// TestCheck: --check validates the services file and the configuration
// file, whatever the flags point at, and lists every problem of each.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	good, bad, empty := file("good.yaml", goodServices), file("bad.yaml", badServices), file("empty.yaml", "")
	cfg, badCfg := file("config.yaml", goodConfig), file("bad-config.yaml", badConfig)
	missing := filepath.Join(dir, "missing.yaml")

	tests := []struct {
		name    string
		args    []string
		ok      bool
		outputs []string // each in the report
	}{
		{"good services file", []string{"--services", good}, true,
			[]string{"services file " + good + ": ok (1 service ports)", "configuration file: none given"}},
		{"good services and configuration", []string{"--services", good, "--config", cfg}, true,
			[]string{"services file " + good + ": ok", "configuration file " + cfg + ": ok"}},
		{"embedded example", nil, true, []string{"embedded example services file: ok (2 service ports)"}},
		{"every problem of the services file", []string{"--services", bad}, false,
			append([]string{"services file " + bad + ": 2 problem(s):"}, badServicesProblems...)},
		{"an empty services file", []string{"--services", empty}, false, []string{`write "services: []" to serve no Services`}},
		{"a missing services file", []string{"--services", missing}, false, []string{"no such file or directory"}},
		{"every problem of the configuration", []string{"--services", good, "--config", badCfg}, false,
			append([]string{"services file " + good + ": ok", "configuration file " + badCfg + ": 2 problem(s):"}, badConfigProblems...)},
		{"both files bad", []string{"--services", bad, "--config", badCfg}, false,
			append(append([]string{}, badServicesProblems...), badConfigProblems...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseFlags(append([]string{"--check"}, tt.args...), outsidePod)
			if err != nil {
				t.Fatalf("parseFlags: %v", err)
			}
			var out bytes.Buffer
			err = check(o, &out)
			if (err == nil) != tt.ok {
				t.Errorf("check: %v, want ok: %v", err, tt.ok)
			}
			for _, want := range tt.outputs {
				if !strings.Contains(out.String(), want) {
					t.Errorf("report does not say %q:\n%s", want, out.String())
				}
			}
		})
	}
}

// TestBinaryCheck runs the real binary: --check exits 0 or 1 listing every
// problem, and svcproxy refuses to start on a services file with problems,
// naming them all.
func TestBinaryCheck(t *testing.T) {
	bin := buildSvcproxy(t)
	dir := t.TempDir()
	good, bad, badCfg := filepath.Join(dir, "good.yaml"), filepath.Join(dir, "bad.yaml"), filepath.Join(dir, "config.yaml")
	for path, content := range map[string]string{good: goodServices, bad: badServices, badCfg: badConfig} {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		args []string
		code int
		says []string
	}{
		{"--check, good file", []string{"--check", "--services", good}, 0, []string{": ok"}},
		{"--check, bad services file", []string{"--check", "--services", bad}, 1, badServicesProblems},
		{"--check, bad configuration", []string{"--check", "--services", good, "--config", badCfg}, 1, badConfigProblems},
		{"start on a bad services file", []string{"--services", bad, "--handover-socket=", "--mark=0",
			"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
			"--metrics-bind-address=", "--healthz-bind-address=", "--conn-log="}, 1,
			append([]string{"nothing started"}, badServicesProblems...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(bin, tt.args...)
			out, err := cmd.CombinedOutput()
			code := 0
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				code = exit.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tt.code {
				t.Errorf("exit status %d, want %d; output:\n%s", code, tt.code, out)
			}
			for _, want := range tt.says {
				if !strings.Contains(string(out), want) {
					t.Errorf("output does not say %q:\n%s", want, out)
				}
			}
		})
	}
}
