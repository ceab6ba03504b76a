package main

import (
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string // empty: no error
	}{
		{"defaults", nil, ""},
		{"redirect steering", []string{"--steering=redirect"}, ""},
		{"unknown steering", []string{"--steering=tproxy"}, "--steering"},
		{"unknown mode", []string{"--proxy-mode=ebpf"}, "--proxy-mode"},
		{"redirect needs a mark", []string{"--steering=redirect", "--mark=0"}, "--mark"},
		{"bad mark", []string{"--mark=zebra"}, "--mark"},
		{"bad dial timeouts", []string{"--dial-timeouts=250ms,-1s"}, "--dial-timeouts"},
		{"too many attempts", []string{"--dial-timeouts=" + strings.Repeat("1s,", 16) + "1s"}, "--dial-timeouts"},
		{"bad nodeport addresses", []string{"--nodeport-addresses=10.0.0.0/33"}, "--nodeport-addresses"},
		{"profiling off loopback", []string{"--profiling-bind-address=0.0.0.0:6060"}, "--profiling-bind-address"},
		{"profiling on loopback", []string{"--profiling-bind-address=127.0.0.1:6060"}, ""},
		{"bad sample", []string{"--conn-log-sample=0"}, "--conn-log-sample"},
		{"min sync above sync", []string{"--sync-period=1s", "--min-sync-period=2s"}, "--min-sync-period"},
		{"stray argument", []string{"extra"}, "unexpected argument"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args)
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
