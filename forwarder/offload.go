package forwarder

import "github.com/svcproxy/svcproxy/offload"

// Offload names a way to move established TCP connections' bytes in the
// kernel (see Config.Offload).
type Offload string

const (
	// OffloadNone moves every byte through the event loop.
	OffloadNone Offload = "none"
	// OffloadSockmap puts both sockets of an established connection into a
	// BPF sockmap whose verdict program sends each socket's bytes out of
	// its peer (package offload); accept, backend choice, retries, FIN,
	// RST, timeouts and the connection log stay in the event loop.
	OffloadSockmap Offload = "sockmap"
)

// Offloader is what the event loop needs of package offload's Sockmap:
// insert a connected pair, remove it, read what the kernel moved for it.
// offloadtest.Fake is the in-memory one.
type Offloader interface {
	Insert(client, backend int) (offload.Pair, error)
	Remove(offload.Pair)
	Bytes(offload.Pair) (offload.Counts, error)
}
