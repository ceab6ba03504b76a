//go:build !linux

package daemon

import "context"

// listNFTTables: nf_tables is Linux's.
var listNFTTables func(context.Context) ([]byte, error)
