//go:build unix

package main

import (
	"os"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestIgnoreHangup: with the API server as the source, a SIGHUP is logged,
// not the end of the process (Go's default, which kills this test).
func TestIgnoreHangup(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	stop := ignoreHangup(zap.New(core))
	defer stop()
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); logs.FilterMessageSnippet("SIGHUP").Len() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("SIGHUP was not logged")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
