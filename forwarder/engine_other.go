//go:build !linux

package forwarder

const defaultEngine = EngineGoroutines

func newEngine(f *Forwarder) (tcpEngine, error) { return newGoEngine(f), nil }
