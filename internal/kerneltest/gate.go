package kerneltest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// Gate is one package's precondition for its privileged tests. Declare it
// as a package variable; its zero state is ready.
type Gate struct {
	// Package is how `go test` names the package in the skip message for
	// non-root users: "./redirect/".
	Package string
	// Prefix starts the name of every namespace the package's tests make
	// ("svcproxy-test-"); 8 hex digits follow.
	Prefix string
	// Tools must be on PATH.
	Tools []string
	// Probe, if set, runs once in a throwaway namespace; an error skips
	// every privileged test with its text, so it should say what the
	// kernel or the tools lack.
	Probe func(ns string) error

	once sync.Once
	skip string
}

// Require skips tb unless it runs as root, with g.Tools on PATH, able to
// create a network namespace in which g.Probe succeeds. The check runs
// once; later calls repeat its verdict.
func (g *Gate) Require(tb testing.TB) {
	tb.Helper()
	g.once.Do(func() { g.skip = g.check() })
	if g.skip != "" {
		tb.Skip(g.skip)
	}
}

func (g *Gate) check() string {
	if os.Geteuid() != 0 {
		return fmt.Sprintf("needs root: run `sudo go test %s` (the privileged tests only touch namespaces they create)", g.Package)
	}
	for _, tool := range g.Tools {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Sprintf("needs %s on PATH (apt-get install iproute2 iptables ipset): %v", tool, err)
		}
	}
	name := g.Prefix + "probe-" + RandHex(4)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return fmt.Sprintf("cannot create a network namespace: %v: %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", name).Run()
	if g.Probe != nil {
		if err := g.Probe(name); err != nil {
			return err.Error()
		}
	}
	return ""
}

// NewNS creates a namespace named g.Prefix + 8 hex digits with lo up,
// deleted when tb ends (also on failure).
func (g *Gate) NewNS(tb testing.TB) string {
	tb.Helper()
	name := g.Prefix + RandHex(4)
	Run(tb, "ip", "netns", "add", name)
	tb.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			tb.Errorf("deleting namespace %s: %v: %s", name, err, out)
		}
	})
	Run(tb, "ip", "-n", name, "link", "set", "lo", "up")
	return name
}

// Run runs a command, fails tb on error and returns its combined output.
func Run(tb testing.TB, name string, args ...string) string {
	tb.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// RandHex returns n random bytes in hex (2n digits), for unique names.
func RandHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
