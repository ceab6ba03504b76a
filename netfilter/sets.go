package netfilter

import "github.com/svcproxy/svcproxy/netfilter/internal/model"

// The ipset types svcproxy's modes create (CanonicalMembers, SetDef).
const (
	SetIP       = model.SetIP
	SetIPPort   = model.SetIPPort
	SetIPPortIP = model.SetIPPortIP
	SetNet      = model.SetNet
	SetPort     = model.SetPort
)
