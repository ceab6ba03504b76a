package main

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/conntrack"
)

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

// TestWriteConfigConntrack: the conntrack section --write-config-to writes
// reads back as the same tuning.
func TestWriteConfigConntrack(t *testing.T) {
	o, err := parseFlags([]string{"--conntrack-max-per-core=0", "--conntrack-min=1000", "--conntrack-tcp-timeout-established=48h",
		"--conntrack-tcp-timeout-close-wait=0", "--conntrack-tcp-be-liberal", "--conntrack-udp-timeout=40s", "--conntrack-udp-timeout-stream=3m"}, outsidePod)
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
}
