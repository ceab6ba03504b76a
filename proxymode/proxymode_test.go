package proxymode

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/svcproxy/svcproxy/lb"
)

func TestChoose(t *testing.T) {
	ok := func(context.Context) error { return nil }
	no := func(context.Context) error { return errors.New("missing") }
	tests := []struct {
		name       string
		requested  Name
		annotation string
		probes     map[Name]Probe
		want       Name
		source     string
		fallbacks  int
		wantErr    bool
	}{
		{name: "default is userspace", want: Userspace, source: "default"},
		{name: "flag wins over annotation", requested: IPTables, annotation: "ipvs", want: IPTables, source: "flag"},
		{name: "annotation when no flag", annotation: "IPVS", want: IPVS, source: "annotation"},
		{name: "bad annotation ignored", annotation: "ebpf", want: Userspace, source: "default", fallbacks: 1},
		{name: "ipvs falls back to iptables", requested: IPVS, probes: map[Name]Probe{IPVS: no, IPTables: ok}, want: IPTables, source: "flag", fallbacks: 1},
		{name: "ipvs falls back to userspace", requested: IPVS, probes: map[Name]Probe{IPVS: no, IPTables: no}, want: Userspace, source: "flag", fallbacks: 2},
		{name: "iptables falls back to userspace", requested: IPTables, probes: map[Name]Probe{IPTables: no, Userspace: ok}, want: Userspace, source: "flag", fallbacks: 1},
		{name: "nothing can run", requested: IPVS, probes: map[Name]Probe{IPVS: no, IPTables: no, Userspace: no}, wantErr: true},
		{name: "annotation mode falls back too", annotation: "ipvs", probes: map[Name]Probe{IPVS: no}, want: IPTables, source: "annotation", fallbacks: 1},
		{name: "nftables by flag", requested: NFTables, annotation: "ipvs", probes: map[Name]Probe{NFTables: ok}, want: NFTables, source: "flag"},
		{name: "nftables by annotation", annotation: "nftables", probes: map[Name]Probe{NFTables: ok}, want: NFTables, source: "annotation"},
		{name: "nftables annotation in any case", annotation: " NFTables ", want: NFTables, source: "annotation"},
		{name: "nftables falls back to iptables", requested: NFTables, probes: map[Name]Probe{NFTables: no, IPTables: ok}, want: IPTables, source: "flag", fallbacks: 1},
		{name: "nftables falls back to userspace", requested: NFTables, probes: map[Name]Probe{NFTables: no, IPTables: no}, want: Userspace, source: "flag", fallbacks: 2},
		{name: "nftables annotation falls back too", annotation: "nftables", probes: map[Name]Probe{NFTables: no}, want: IPTables, source: "annotation", fallbacks: 1},
		{name: "nftables: nothing can run", requested: NFTables, probes: map[Name]Probe{NFTables: no, IPTables: no, Userspace: no}, wantErr: true},
		{name: "ipvs does not fall back to nftables", requested: IPVS, probes: map[Name]Probe{IPVS: no, IPTables: no, NFTables: ok}, want: Userspace, source: "flag", fallbacks: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t2 := Table{}
			for name, p := range tc.probes {
				t2[name] = Entry{Probe: p}
			}
			c, err := Choose(context.Background(), tc.requested, tc.annotation, t2)
			if tc.wantErr {
				if !errors.Is(err, ErrNoMode) {
					t.Fatalf("err = %v, want ErrNoMode", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Name != tc.want || c.Source != tc.source || len(c.Fallbacks) != tc.fallbacks {
				t.Fatalf("got %+v, want mode %s from %s with %d fallbacks", c, tc.want, tc.source, tc.fallbacks)
			}
		})
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]Name{"": "", "userspace": Userspace, " IPTables ": IPTables, "ipvs": IPVS,
		"nftables": NFTables, "NFTables": NFTables} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	_, err := Parse("ebpf")
	if err == nil {
		t.Fatal("Parse(ebpf) succeeded")
	}
	if want := "want userspace, iptables, ipvs or nftables"; !strings.Contains(err.Error(), want) {
		t.Errorf("Parse(ebpf) = %v, want it to list the modes: %q", err, want)
	}
}

// fakeMode records the calls a Table makes.
type fakeMode struct {
	name        Name
	calls       *[]string
	unavailable error
}

func (m fakeMode) Apply(context.Context, *lb.Snapshot, bool) error { return nil }
func (m fakeMode) Cleanup(context.Context) error {
	*m.calls = append(*m.calls, "cleanup "+string(m.name))
	return nil
}
func (m fakeMode) Close(context.Context, bool) error { return nil }
func (m fakeMode) Available(context.Context) error   { return m.unavailable }

// TestTable: Built modes are probed through Available and cleaned up
// through Cleanup; Cleanup spares the mode kept; New refuses a mode the
// table lacks.
func TestTable(t *testing.T) {
	var calls []string
	built := func(name Name, unavailable error) Entry {
		return Built(func(context.Context) (Mode, error) {
			calls = append(calls, "new "+string(name))
			return fakeMode{name: name, calls: &calls, unavailable: unavailable}, nil
		})
	}
	table := Table{IPTables: built(IPTables, nil), IPVS: built(IPVS, errors.New("no ip_vs")), NFTables: built(NFTables, errors.New("no nf_tables"))}
	ctx := context.Background()
	c, err := Choose(ctx, IPVS, "", table)
	if err != nil || c.Name != IPTables || len(c.Fallbacks) != 1 || !strings.Contains(c.Fallbacks[0], "no ip_vs") {
		t.Fatalf("Choose = %+v, %v; want iptables after ipvs said no ip_vs", c, err)
	}
	c, err = Choose(ctx, "", "nftables", table)
	if err != nil || c.Name != IPTables || c.Requested != NFTables || c.Source != "annotation" || len(c.Fallbacks) != 1 || !strings.Contains(c.Fallbacks[0], "no nf_tables") {
		t.Fatalf("Choose(annotation nftables) = %+v, %v; want iptables after nftables said no nf_tables", c, err)
	}
	calls = nil
	if err := table.Cleanup(ctx, IPTables); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(calls, ", "), "new ipvs, cleanup ipvs, new nftables, cleanup nftables"; got != want {
		t.Errorf("Cleanup(keep iptables) called %q, want %q", got, want)
	}
	calls = nil
	if err := table.Cleanup(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(calls, ", "), "new iptables, cleanup iptables, new ipvs, cleanup ipvs, new nftables, cleanup nftables"; got != want {
		t.Errorf("Cleanup(all) called %q, want %q", got, want)
	}
	if _, err := table.New(ctx, Userspace, nil); err == nil || !strings.Contains(err.Error(), "not built into") {
		t.Errorf("New(userspace) = %v, want not built into this svcproxy", err)
	}
}
