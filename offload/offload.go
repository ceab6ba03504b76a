package offload

import "errors"

// Pair names an offloaded connection: the socket cookies (SO_COOKIE) of
// its client and backend sockets.
type Pair struct {
	Client, Backend uint64
}

// Counts are the bytes the kernel moved for a pair since it was inserted:
// In from the client to the backend, Out from the backend to the client.
type Counts struct {
	In, Out uint64
}

// ErrUnsupported is returned by New where the kernel (or the system) has
// no sockmap, or refuses the program.
var ErrUnsupported = errors.New("sockmap offload unsupported")

// Config configures a Sockmap. Zero values mean the stated defaults.
type Config struct {
	// MaxPairs bounds the connections offloaded at once; Insert fails past
	// it and the connection stays on the user-space path. Zero: 65536.
	MaxPairs int
}

func (c Config) maxPairs() int {
	if c.MaxPairs <= 0 {
		return 65536
	}
	return c.MaxPairs
}
