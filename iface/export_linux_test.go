package iface

// SetAddrSocketBuffer sets the receive buffer asked for address
// notifications until the returned func restores it.
func SetAddrSocketBuffer(n int) (restore func()) {
	old := addrSocketBuffer
	addrSocketBuffer = n
	return func() { addrSocketBuffer = old }
}
