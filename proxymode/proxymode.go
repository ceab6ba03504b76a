// Package proxymode owns the choice of proxy mode: the one asked for (flag
// or config), else the node's net.experimental.kubernetes.io/proxy-mode
// annotation, else userspace; and the fallback ipvs → iptables → userspace
// when the kernel lacks what the chosen mode needs.
package proxymode

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Mode names a proxy mode.
type Mode string

// The modes. Userspace is svcproxy's main data path and the default.
const (
	Userspace Mode = "userspace"
	IPTables  Mode = "iptables"
	IPVS      Mode = "ipvs"
)

// Annotation is the Node annotation that picks a mode when none is asked
// for, as kube-proxy once honoured it.
const Annotation = "net.experimental.kubernetes.io/proxy-mode"

// Parse accepts a mode name in any case; "" is allowed and means "choose".
func Parse(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case "", Userspace, IPTables, IPVS:
		return m, nil
	}
	return "", fmt.Errorf("unknown proxy mode %q (want userspace, iptables or ipvs)", s)
}

// fallback is the mode to try when m cannot run.
func fallback(m Mode) Mode {
	switch m {
	case IPVS:
		return IPTables
	case IPTables:
		return Userspace
	}
	return ""
}

// Probe reports why a mode cannot run on this node, or nil if it can.
type Probe func(ctx context.Context) error

// Choice is the mode that will run and how it was chosen.
type Choice struct {
	Mode      Mode
	Requested Mode     // what was asked for, before fallback
	Source    string   // "flag", "annotation" or "default"
	Fallbacks []string // why each earlier mode could not run, in order
}

func (c Choice) String() string {
	s := fmt.Sprintf("%s (from %s", c.Mode, c.Source)
	if c.Mode != c.Requested {
		s += fmt.Sprintf(", asked for %s; %s", c.Requested, strings.Join(c.Fallbacks, "; "))
	}
	return s + ")"
}

// ErrNoMode means not even the userspace mode can run.
var ErrNoMode = errors.New("no proxy mode can run on this node")

// Choose picks the mode: requested if not empty, else the annotation's if
// it names a mode, else Userspace; then falls back while the mode's probe
// fails. A mode without a probe is taken to work. An annotation that names
// no mode is ignored, and said so in Fallbacks.
func Choose(ctx context.Context, requested Mode, annotation string, probes map[Mode]Probe) (Choice, error) {
	c := Choice{Mode: requested, Source: "flag"}
	if c.Mode == "" {
		c.Source = "default"
		c.Mode = Userspace
		if annotation != "" {
			if m, err := Parse(annotation); err == nil && m != "" {
				c.Mode, c.Source = m, "annotation"
			} else {
				c.Fallbacks = append(c.Fallbacks, fmt.Sprintf("ignored node annotation %s=%q", Annotation, annotation))
			}
		}
	}
	c.Requested = c.Mode
	for c.Mode != "" {
		probe := probes[c.Mode]
		if probe == nil {
			return c, nil
		}
		err := probe(ctx)
		if err == nil {
			return c, nil
		}
		c.Fallbacks = append(c.Fallbacks, fmt.Sprintf("%s unavailable: %v", c.Mode, err))
		c.Mode = fallback(c.Mode)
	}
	return c, fmt.Errorf("%w: %s", ErrNoMode, strings.Join(c.Fallbacks, "; "))
}
