//go:build linux

package nftable

import (
	"slices"
	"testing"
)

func TestBySet(t *testing.T) {
	e := func(set, key string) Element { return Element{Set: set, Key: key} }
	for _, tc := range []struct{ in, want []Element }{
		{nil, nil},
		{[]Element{e("a", "1"), e("a", "2"), e("b", "1")}, []Element{e("a", "1"), e("a", "2"), e("b", "1")}},
		{[]Element{e("a", "1"), e("b", "1"), e("a", "2"), e("c", "1"), e("b", "2")},
			[]Element{e("a", "1"), e("a", "2"), e("b", "1"), e("b", "2"), e("c", "1")}},
	} {
		if got := bySet(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("bySet(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
