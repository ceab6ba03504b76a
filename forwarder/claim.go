package forwarder

import (
	"fmt"
	"net/netip"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/lb"
)

// NodePort claims
//
// With steering rules, NodePort traffic never reaches a socket bound to the
// NodePort: the rules redirect it first. Yet the port must stay svcproxy's,
// or another program could bind it and be shadowed by the rules (or take
// over when they are gone). So, with Config.ClaimNodePorts, every NodePort
// is claimed by a socket that is bound and never used: a TCP socket that
// does not listen (a stray SYN gets a reset, never a hung handshake) or a
// UDP socket that is never read (with the smallest receive buffer). Each is
// dual-stack, so one socket holds the port for IPv4 and IPv6.

type claimKey struct {
	proto lb.Protocol
	port  uint16
}

// nodePortClaims lists the NodePorts of snap, but SCTP ones: without SCTP
// sockets they cannot be claimed (and the forwarder does not serve them).
func nodePortClaims(snap *lb.Snapshot) map[claimKey]bool {
	want := map[claimKey]bool{}
	for _, b := range snap.Balancers() {
		if svc := b.Service; svc.NodePort != 0 && svc.Protocol != lb.SCTP {
			want[claimKey{svc.Protocol, svc.NodePort}] = true
		}
	}
	return want
}

// reconcileClaims claims new NodePorts and releases gone ones. Called with
// f.mu held.
func (f *Forwarder) reconcileClaims(snap *lb.Snapshot) []error {
	if !f.cfg.ClaimNodePorts {
		return nil
	}
	want := nodePortClaims(snap)
	for k, file := range f.claims {
		if !want[k] {
			file.Close()
			delete(f.claims, k)
			f.socketsGen++
		}
	}
	var errs []error
	for k := range want {
		if _, ok := f.claims[k]; ok {
			continue
		}
		file := f.inherit(k.socketName())
		var err error
		if file == nil {
			file, err = claimPort(k)
		}
		if err != nil {
			f.m.ListenErrors.Inc()
			f.log.Warn("cannot claim NodePort; another program holds it", zap.Stringer("protocol", k.proto), zap.Uint16("port", k.port), zap.Error(err))
			errs = append(errs, err)
			continue
		}
		f.claims[k] = file
		f.socketsGen++
	}
	return errs
}

func (k claimKey) socketName() string { return fmt.Sprintf("claim/%v/%d", k.proto, k.port) }

// ClaimedNodePorts returns the NodePorts the forwarder holds, for tests and
// status.
func (f *Forwarder) ClaimedNodePorts() []netip.AddrPort {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []netip.AddrPort
	for k := range f.claims {
		out = append(out, netip.AddrPortFrom(netip.IPv6Unspecified(), k.port))
	}
	return out
}
