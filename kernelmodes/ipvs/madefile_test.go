package ipvs

import (
	"slices"
	"testing"
)

// FuzzParseMade: any content parses without panicking, and what it keeps
// survives formatMade and parseMade again unchanged.
func FuzzParseMade(f *testing.F) {
	for _, s := range []string{
		madeHeader + "tcp 192.0.2.7:30080\nudp [2001:db8::7]:30053\nsctp 192.0.2.7:30132\n",
		"tcp ::ffff:192.0.2.7:1\n",
		"TCP 192.0.2.7:80\n# a comment\n\n",
		"tcp nonsense\nbogus\n",
		"tcp 192.0.2.7:99999\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		keys, _ := parseMade(data)
		again, err := parseMade(formatMade(slices.Clone(keys)))
		if err != nil {
			t.Fatalf("formatMade(%v) does not parse: %v", keys, err)
		}
		slices.SortFunc(keys, vsKey.Compare)
		if !slices.Equal(keys, again) {
			t.Fatalf("round trip: %v, want %v", again, keys)
		}
	})
}
