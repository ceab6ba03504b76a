//go:build !linux

package ipvs

import (
	"net"
	"time"
)

// The IPVS interface's types, where moby/ipvs (Linux-only) does not build:
// the fields of its Service, SvcStats, Destination and Config (Timeouts)
// that Mode and the fakes use, so the mode's logic and its tests build
// everywhere.
type (
	Service struct {
		Address       net.IP
		Protocol      uint16
		Port          uint16
		FWMark        uint32
		SchedName     string
		Flags         uint32
		Timeout       uint32
		Netmask       uint32
		AddressFamily uint16
		PEName        string
		Stats         ServiceStats
	}
	ServiceStats struct {
		Connections, PacketsIn, PacketsOut uint32
		BytesIn, BytesOut                  uint64
		CPS, BPSOut, PPSIn, PPSOut, BPSIn  uint32
	}
	Destination struct {
		Address             net.IP
		Port                uint16
		Weight              int
		ConnectionFlags     uint32
		AddressFamily       uint16
		UpperThreshold      uint32
		LowerThreshold      uint32
		ActiveConnections   int
		InactiveConnections int
	}
	Timeouts struct {
		TimeoutTCP    time.Duration
		TimeoutTCPFin time.Duration
		TimeoutUDP    time.Duration
	}
)

const connectionFlagMasq = 0 // IP_VS_CONN_F_MASQ
