package forwarder

const defaultEngine = EngineEventLoop

func newEngine(f *Forwarder) (tcpEngine, error) {
	if f.cfg.Engine == EngineGoroutines {
		return newGoEngine(f), nil
	}
	return newLoopEngine(f)
}
