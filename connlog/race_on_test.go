//go:build race

package connlog

// raceEnabled: the race detector makes sync.Pool drop a quarter of what is
// put back, so allocation counts that rely on a pool are not exact.
const raceEnabled = true
