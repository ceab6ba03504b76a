//go:build !linux

package iface

import (
	"context"

	"github.com/vishvananda/netns"
)

// WatchLocalAddrs fails: there is no rtnetlink here.
func WatchLocalAddrs(context.Context, netns.NsHandle, func(error)) (*LocalAddrs, error) {
	return nil, unsupported()
}
