package firewall

import (
	"net/netip"
	"slices"
	"testing"
)

func TestMerge(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []string // first-last
	}{
		{[]string{"10.0.0.0/8"}, []string{"10.0.0.0-10.255.255.255"}},
		{[]string{"10.1.0.0/16", "10.0.0.0/8"}, []string{"10.0.0.0-10.255.255.255"}},
		{[]string{"10.0.0.0/8", "11.0.0.0/8", "13.0.0.0/8"}, []string{"10.0.0.0-11.255.255.255", "13.0.0.0-13.255.255.255"}},
		{[]string{"255.255.255.255/32", "255.255.255.254/32", "0.0.0.0/32"}, []string{"0.0.0.0-0.0.0.0", "255.255.255.254-255.255.255.255"}},
		{[]string{"0.0.0.0/1", "128.0.0.0/1"}, []string{"0.0.0.0-255.255.255.255"}},
		{[]string{"fd00::/64", "fd00:0:0:1::/64", "fd00::5/128"}, []string{"fd00::-fd00::1:ffff:ffff:ffff:ffff"}},
		{[]string{"192.0.2.7/32"}, []string{"192.0.2.7-192.0.2.7"}},
	} {
		var in []netip.Prefix
		for _, p := range tc.in {
			in = append(in, netip.MustParsePrefix(p))
		}
		var got []string
		for _, s := range merge(in) {
			got = append(got, s.first.String()+"-"+s.last.String())
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("merge(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
