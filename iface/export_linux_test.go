package iface

// SetAddrSocketBuffer sets the receive buffer asked for address
// notifications until the returned func restores it.
func SetAddrSocketBuffer(n int) (restore func()) {
	old := addrSocketBuffer.Swap(int64(n))
	return func() { addrSocketBuffer.Store(old) }
}
