package daemon

import (
	"context"
	"strings"

	"github.com/svcproxy/svcproxy/netfilter/nftable"
)

// listNFTTables lists this namespace's nftables tables over netlink, as
// `nft list tables` prints them, without the nft tool's cache of every set
// element.
func listNFTTables(context.Context) ([]byte, error) {
	ts, err := nftable.ListTables("")
	if err != nil {
		return nil, err
	}
	return []byte(strings.Join(ts, "\n")), nil
}
