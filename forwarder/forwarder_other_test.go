//go:build !linux

package forwarder

import (
	"errors"
	"net/netip"
	"testing"
)

// TestLinuxOnlyConfigRefused: what needs Linux fails at New, clearly, and
// a mark is dropped rather than failing every dial.
func TestLinuxOnlyConfigRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"redirect", Config{Redirect: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:0")}}},
		{"claims", Config{ClaimNodePorts: true}},
		{"event loop", Config{Engine: EngineEventLoop}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := New(tc.cfg)
			if err == nil {
				t.Fatalf("New(%+v) = %v, want an error", tc.cfg, f)
			}
			if tc.name != "event loop" && !errors.Is(err, errors.ErrUnsupported) {
				t.Errorf("New: %v, want errors.ErrUnsupported", err)
			}
		})
	}
	cfg, err := Config{Mark: DefaultMark}.withDefaults()
	if err != nil || cfg.Mark != -1 {
		t.Errorf("withDefaults with a mark: mark %d, err %v; want -1, nil", cfg.Mark, err)
	}
}
