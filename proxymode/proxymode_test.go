package proxymode

import (
	"context"
	"errors"
	"testing"
)

func TestChoose(t *testing.T) {
	ok := func(context.Context) error { return nil }
	no := func(context.Context) error { return errors.New("missing") }
	tests := []struct {
		name       string
		requested  Mode
		annotation string
		probes     map[Mode]Probe
		want       Mode
		source     string
		fallbacks  int
		wantErr    bool
	}{
		{name: "default is userspace", want: Userspace, source: "default"},
		{name: "flag wins over annotation", requested: IPTables, annotation: "ipvs", want: IPTables, source: "flag"},
		{name: "annotation when no flag", annotation: "IPVS", want: IPVS, source: "annotation"},
		{name: "bad annotation ignored", annotation: "ebpf", want: Userspace, source: "default", fallbacks: 1},
		{name: "ipvs falls back to iptables", requested: IPVS, probes: map[Mode]Probe{IPVS: no, IPTables: ok}, want: IPTables, source: "flag", fallbacks: 1},
		{name: "ipvs falls back to userspace", requested: IPVS, probes: map[Mode]Probe{IPVS: no, IPTables: no}, want: Userspace, source: "flag", fallbacks: 2},
		{name: "iptables falls back to userspace", requested: IPTables, probes: map[Mode]Probe{IPTables: no, Userspace: ok}, want: Userspace, source: "flag", fallbacks: 1},
		{name: "nothing can run", requested: IPVS, probes: map[Mode]Probe{IPVS: no, IPTables: no, Userspace: no}, wantErr: true},
		{name: "annotation mode falls back too", annotation: "ipvs", probes: map[Mode]Probe{IPVS: no}, want: IPTables, source: "annotation", fallbacks: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Choose(context.Background(), tc.requested, tc.annotation, tc.probes)
			if tc.wantErr {
				if !errors.Is(err, ErrNoMode) {
					t.Fatalf("err = %v, want ErrNoMode", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Mode != tc.want || c.Source != tc.source || len(c.Fallbacks) != tc.fallbacks {
				t.Fatalf("got %+v, want mode %s from %s with %d fallbacks", c, tc.want, tc.source, tc.fallbacks)
			}
		})
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]Mode{"": "", "userspace": Userspace, " IPTables ": IPTables, "ipvs": IPVS} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := Parse("nftables"); err == nil {
		t.Error("Parse(nftables) succeeded")
	}
}
