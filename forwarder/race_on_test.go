//go:build race

package forwarder

const raceEnabled = true
