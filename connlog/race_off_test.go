//go:build !race

package connlog

const raceEnabled = false
