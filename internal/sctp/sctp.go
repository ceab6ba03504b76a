// Package sctp builds and reads the SCTP packets svcproxy's tests send
// through raw sockets (IPPROTO_SCTP): Go has no SCTP sockets, and a kernel
// without SCTP (CONFIG_IP_SCTP unset) still tracks, matches and NATs SCTP
// packets, so a test can send an INIT chunk with a raw socket and see where
// netfilter delivers it. Only what such tests need: the common header
// (RFC 9260 section 3.1), an INIT chunk (section 3.3.2) and the CRC32c
// checksum (appendix A).
package sctp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Chunk types.
const (
	ChunkInit  = 1
	ChunkAbort = 6
)

const (
	headerLen = 12 // source port, destination port, verification tag, checksum
	initLen   = 20 // the INIT chunk without optional parameters
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Packet is the part of an SCTP packet the tests look at.
type Packet struct {
	SrcPort, DstPort uint16
	VerificationTag  uint32
	Chunk            uint8  // the first chunk's type
	InitiateTag      uint32 // an INIT chunk's Initiate Tag; 0 otherwise
}

// Init returns an SCTP packet of one INIT chunk from srcPort to dstPort
// with a correct checksum: the first packet of an association, which
// conntrack sees as NEW. initiateTag must not be 0 (RFC 9260 3.3.2).
func Init(srcPort, dstPort uint16, initiateTag uint32) []byte {
	b := make([]byte, headerLen+initLen)
	binary.BigEndian.PutUint16(b[0:], srcPort)
	binary.BigEndian.PutUint16(b[2:], dstPort)
	// Verification tag 0: an INIT carries none yet. b[8:12] is the checksum.
	c := b[headerLen:]
	c[0] = ChunkInit
	binary.BigEndian.PutUint16(c[2:], initLen)
	binary.BigEndian.PutUint32(c[4:], initiateTag)
	binary.BigEndian.PutUint32(c[8:], 65535) // advertised receiver window credit
	binary.BigEndian.PutUint16(c[12:], 1)    // outbound streams
	binary.BigEndian.PutUint16(c[14:], 1)    // inbound streams
	binary.BigEndian.PutUint32(c[16:], initiateTag)
	binary.LittleEndian.PutUint32(b[8:], checksum(b))
	return b
}

// checksum is the CRC32c of b with its checksum field taken as zero. The
// result goes into the packet in little-endian order (RFC 9260 appendix A:
// the CRC's bytes in the order the algorithm produces them).
func checksum(b []byte) uint32 {
	var zero [4]byte
	crc := crc32.Update(0, castagnoli, b[:8])
	crc = crc32.Update(crc, castagnoli, zero[:])
	return crc32.Update(crc, castagnoli, b[headerLen:])
}

// Parse reads an SCTP packet (what follows the IP header). It fails on a
// short packet, a truncated first chunk or a wrong checksum: a NAT that
// rewrote a port must also have rewritten the checksum.
func Parse(b []byte) (Packet, error) {
	if len(b) < headerLen+4 {
		return Packet{}, fmt.Errorf("sctp: %d bytes, shorter than a header and a chunk", len(b))
	}
	if got, want := binary.LittleEndian.Uint32(b[8:]), checksum(b); got != want {
		return Packet{}, fmt.Errorf("sctp: checksum %#08x, want %#08x", got, want)
	}
	p := Packet{
		SrcPort:         binary.BigEndian.Uint16(b[0:]),
		DstPort:         binary.BigEndian.Uint16(b[2:]),
		VerificationTag: binary.BigEndian.Uint32(b[4:]),
		Chunk:           b[headerLen],
	}
	n := int(binary.BigEndian.Uint16(b[headerLen+2:]))
	if n < 4 || headerLen+n > len(b) {
		return Packet{}, fmt.Errorf("sctp: chunk length %d in a packet of %d bytes", n, len(b))
	}
	if p.Chunk == ChunkInit {
		if n < initLen {
			return Packet{}, errors.New("sctp: INIT chunk too short")
		}
		p.InitiateTag = binary.BigEndian.Uint32(b[headerLen+4:])
	}
	return p, nil
}
