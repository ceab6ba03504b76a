package sctp

import (
	"encoding/binary"
	"encoding/hex"
	"testing"
)

// TestChecksumKnownAnswer checks the CRC32c against RFC 3720's B.4 test
// vector (32 bytes of zeros: 0x8a9136aa) laid out as an SCTP packet, so
// the byte order of the checksum field is the one kernels verify.
func TestChecksumKnownAnswer(t *testing.T) {
	b := make([]byte, 32)
	// With the checksum field zero and everything else zero, the CRC is
	// that of 32 zero bytes.
	if got := checksum(b); got != 0x8a9136aa {
		t.Fatalf("checksum of 32 zero bytes = %#08x, want 0x8a9136aa", got)
	}
}

func TestInitParses(t *testing.T) {
	b := Init(40000, 3868, 0x11223344)
	p, err := Parse(b)
	if err != nil {
		t.Fatalf("Parse(Init): %v (%s)", err, hex.EncodeToString(b))
	}
	want := Packet{SrcPort: 40000, DstPort: 3868, Chunk: ChunkInit, InitiateTag: 0x11223344}
	if p != want {
		t.Errorf("Parse(Init) = %+v, want %+v", p, want)
	}
}

func TestParseRefuses(t *testing.T) {
	good := Init(1, 2, 3)
	for _, tc := range []struct {
		name string
		mod  func(b []byte) []byte
	}{
		{"short", func(b []byte) []byte { return b[:10] }},
		{"port rewritten without the checksum", func(b []byte) []byte { b[3]++; return b }},
		{"truncated chunk", func(b []byte) []byte {
			b = b[:20] // the chunk says 20 bytes; 8 are left
			binary.LittleEndian.PutUint32(b[8:], checksum(b))
			return b
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.mod(append([]byte(nil), good...))
			if p, err := Parse(b); err == nil {
				t.Errorf("Parse = %+v, nil; want an error", p)
			}
		})
	}
}
