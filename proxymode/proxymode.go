// Package proxymode owns the proxy-mode contract every mode implements
// (Mode), the table of modes a node can run (Table), and the choice among
// them: the one asked for (flag or config), else the node's
// net.experimental.kubernetes.io/proxy-mode annotation, else userspace;
// and the fallback when the kernel lacks what the chosen mode needs:
// ipvs → iptables → userspace, and nftables → iptables → userspace.
package proxymode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/svcproxy/svcproxy/lb"
)

// Mode is a proxy mode as the daemon drives it. A mode owns the goroutines
// it needs (the IPVS mode's sweeper): Close stops them.
type Mode interface {
	// Apply makes the node serve snap; full also rewrites and prunes. It
	// is idempotent.
	Apply(ctx context.Context, snap *lb.Snapshot, full bool) error
	// Cleanup removes everything the mode installs, also what another
	// process installed.
	Cleanup(ctx context.Context) error
	// Close ends the mode on a clean exit; handedOver means a successor
	// process serves now, so the rules it relies on stay.
	Close(ctx context.Context, handedOver bool) error
	// Available reports why this node cannot run the mode, or nil.
	Available(ctx context.Context) error
}

// Handoverable is a Mode whose sockets a successor process can take over
// (package handover). The daemon calls no Apply once it calls
// StopAccepting or Close (for any mode); an Apply after them leaves the
// node's rules alone, a successor's or being removed.
type Handoverable interface {
	Sockets() (map[string]*os.File, error)
	StopAccepting()
}

// Name names a proxy mode.
type Name string

// The modes. Userspace is svcproxy's main data path and the default.
const (
	Userspace Name = "userspace"
	IPTables  Name = "iptables"
	IPVS      Name = "ipvs"
	NFTables  Name = "nftables"
)

// Annotation is the Node annotation that picks a mode when none is asked
// for, as kube-proxy once honoured it.
const Annotation = "net.experimental.kubernetes.io/proxy-mode"

// Parse accepts a mode name in any case; "" is allowed and means "choose".
func Parse(s string) (Name, error) {
	switch m := Name(strings.ToLower(strings.TrimSpace(s))); m {
	case "", Userspace, IPTables, IPVS, NFTables:
		return m, nil
	}
	return "", fmt.Errorf("unknown proxy mode %q (want userspace, iptables, ipvs or nftables)", s)
}

// fallback is the mode to try when m cannot run.
func fallback(m Name) Name {
	switch m {
	case IPVS, NFTables:
		return IPTables
	case IPTables:
		return Userspace
	}
	return ""
}

// Probe reports why a mode cannot run on this node, or nil if it can.
type Probe func(ctx context.Context) error

// Entry is one mode of a Table.
type Entry struct {
	// New builds the mode to run, on the sockets a predecessor process
	// handed over (package handover; nil: none).
	New func(ctx context.Context, inherited map[string]*os.File) (Mode, error)
	// Probe says whether this node can run the mode. Nil: it can.
	Probe Probe
	// Cleanup removes what the mode installs. Nil: nothing to remove.
	Cleanup func(ctx context.Context) error
}

// Built is the Entry of a mode whose New touches nothing (the kernel
// modes): its probe builds one and asks Available, its cleanup builds one
// and calls Cleanup.
func Built(build func(ctx context.Context) (Mode, error)) Entry {
	return Entry{
		New: func(ctx context.Context, _ map[string]*os.File) (Mode, error) { return build(ctx) },
		Probe: func(ctx context.Context) error {
			m, err := build(ctx)
			if err != nil {
				return err
			}
			return m.Available(ctx)
		},
		Cleanup: func(ctx context.Context) error {
			m, err := build(ctx)
			if err != nil {
				return err
			}
			return m.Cleanup(ctx)
		},
	}
}

// Table is the modes this svcproxy can run, by name.
type Table map[Name]Entry

// order is the order Cleanup removes the modes in.
var order = []Name{Userspace, IPTables, IPVS, NFTables}

// Cleanup removes the rules of every mode of t but keep ("" removes all).
func (t Table) Cleanup(ctx context.Context, keep Name) error {
	var errs []error
	for _, name := range order {
		e, ok := t[name]
		if name == keep || !ok || e.Cleanup == nil {
			continue
		}
		if err := e.Cleanup(ctx); err != nil {
			errs = append(errs, fmt.Errorf("removing %s-mode rules: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// New builds the mode name of t on the inherited sockets.
func (t Table) New(ctx context.Context, name Name, inherited map[string]*os.File) (Mode, error) {
	e, ok := t[name]
	if !ok || e.New == nil {
		return nil, fmt.Errorf("proxy mode %s is not built into this svcproxy", name)
	}
	return e.New(ctx, inherited)
}

// Choice is the mode that will run and how it was chosen.
type Choice struct {
	Name      Name
	Requested Name     // what was asked for, before fallback
	Source    string   // "flag", "annotation" or "default"
	Fallbacks []string // why each earlier mode could not run, in order
}

func (c Choice) String() string {
	s := fmt.Sprintf("%s (from %s", c.Name, c.Source)
	if c.Name != c.Requested {
		s += fmt.Sprintf(", asked for %s; %s", c.Requested, strings.Join(c.Fallbacks, "; "))
	}
	return s + ")"
}

// ErrNoMode means not even the userspace mode can run.
var ErrNoMode = errors.New("no proxy mode can run on this node")

// Choose picks the mode: requested if not empty, else the annotation's if
// it names a mode, else Userspace; then falls back while the mode's probe
// in t fails. A mode without a probe is taken to work. An annotation that
// names no mode is ignored, and said so in Fallbacks.
func Choose(ctx context.Context, requested Name, annotation string, t Table) (Choice, error) {
	c := Choice{Name: requested, Source: "flag"}
	if c.Name == "" {
		c.Source = "default"
		c.Name = Userspace
		if annotation != "" {
			if m, err := Parse(annotation); err == nil && m != "" {
				c.Name, c.Source = m, "annotation"
			} else {
				c.Fallbacks = append(c.Fallbacks, fmt.Sprintf("ignored node annotation %s=%q", Annotation, annotation))
			}
		}
	}
	c.Requested = c.Name
	for c.Name != "" {
		probe := t[c.Name].Probe
		if probe == nil {
			return c, nil
		}
		err := probe(ctx)
		if err == nil {
			return c, nil
		}
		c.Fallbacks = append(c.Fallbacks, fmt.Sprintf("%s unavailable: %v", c.Name, err))
		c.Name = fallback(c.Name)
	}
	return c, fmt.Errorf("%w: %s", ErrNoMode, strings.Join(c.Fallbacks, "; "))
}
