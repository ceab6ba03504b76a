package ipvs

import "github.com/moby/ipvs"

// The IPVS interface's types are moby/ipvs's own, so *ipvs.Handle is the
// real IPVS.
type (
	Service      = ipvs.Service
	ServiceStats = ipvs.SvcStats
	Destination  = ipvs.Destination
	Timeouts     = ipvs.Config
)

const connectionFlagMasq = ipvs.ConnectionFlagMasq

var _ IPVS = (*ipvs.Handle)(nil)
