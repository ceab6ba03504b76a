package netfilter

import (
	"fmt"
	"net/netip"
	"slices"
)

// FamilyOf is the family of a (IPv4-mapped addresses are IPv4).
func FamilyOf(a netip.Addr) Family {
	if a.Unmap().Is4() {
		return IPv4
	}
	return IPv6
}

// UnmapPrefix is p with an IPv4-mapped address (::ffff:10.0.0.0/104) as
// its IPv4 prefix (10.0.0.0/8), masked; any other prefix masked.
func UnmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p.Masked()
}

// NodePortPrefixes sorts --nodeport-addresses by family, as every mode reads
// them: a family is restricted when any prefix is given, unless one of its
// prefixes is a /0; addrs are the family's distinct prefixes when
// restricted. A restricted family with no prefix gets no NodePorts.
func NodePortPrefixes(prefixes []netip.Prefix) (restricted [2]bool, addrs [2][]netip.Prefix, err error) {
	if len(prefixes) == 0 {
		return restricted, addrs, nil
	}
	restricted = [2]bool{true, true}
	for i, p := range prefixes {
		if !p.IsValid() {
			return restricted, addrs, fmt.Errorf("nodePortAddresses[%d]: invalid prefix", i)
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		p = p.Masked()
		fam := FamilyOf(p.Addr())
		if p.Bits() == 0 {
			restricted[fam] = false
			continue
		}
		if !slices.Contains(addrs[fam], p) {
			addrs[fam] = append(addrs[fam], p)
		}
	}
	for fam := range addrs {
		if !restricted[fam] {
			addrs[fam] = nil
		}
	}
	return restricted, addrs, nil
}

// ClusterCIDRs sorts --cluster-cidr by family, as the kernel modes read it:
// at most one pod range per family, masked; a /0 or invalid prefix is no
// pod range.
func ClusterCIDRs(prefixes []netip.Prefix) (byFamily [2]netip.Prefix, err error) {
	for i, p := range prefixes {
		if !p.IsValid() || p.Bits() == 0 {
			return byFamily, fmt.Errorf("clusterCIDRs[%d]: %v is not a pod range", i, p)
		}
		p = p.Masked()
		fam := FamilyOf(p.Addr())
		if byFamily[fam].IsValid() {
			return byFamily, fmt.Errorf("clusterCIDRs: more than one %v range", fam)
		}
		byFamily[fam] = p
	}
	return byFamily, nil
}
