// Package iface owns svcproxy's view of the node's network interfaces: the
// dummy interface that holds Service virtual IPs as local addresses of the
// node (the IPVS mode's, and the userspace mode's with --steering=local,
// as kube-proxy's IPVS mode holds them on kube-ipvs0), and reading the
// node's own addresses. Netlink is the real implementation, over
// rtnetlink; each consumer declares the narrow interface it calls (ipvs.Links,
// userspace.Links), and ipvstest.Links is the in-memory fake of both.
package iface

import "errors"

// ErrNoLink: the network interface does not exist.
var ErrNoLink = errors.New("no such interface")
