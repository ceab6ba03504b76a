package ipvs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// Exec is the real Rules: it runs iptables-restore, iptables-save and ipset
// with exec.CommandContext. The zero value runs the tools on PATH in the
// caller's network namespace.
type Exec struct {
	// NetNS, when set, runs every tool as `ip netns exec NetNS tool ...`.
	NetNS string
	// Variant picks the iptables binaries: "" the iptables-restore etc. on
	// PATH (whatever the node uses), "legacy" iptables-legacy-*, "nft"
	// iptables-nft-*.
	Variant string
}

var _ Rules = (*Exec)(nil)

func (e *Exec) iptables(family Family, tool string) string {
	name := "iptables"
	if family == IPv6 {
		name = "ip6tables"
	}
	if e.Variant != "" {
		name += "-" + e.Variant
	}
	return name + tool
}

func (e *Exec) run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	if e.NetNS != "" {
		args = append([]string{"netns", "exec", e.NetNS, name}, args...)
		name = "ip"
	}
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 1000 {
			msg = msg[:1000] + "..."
		}
		return stdout.Bytes(), &toolError{tool: cmd.Args[:min(len(cmd.Args), 5)], err: err, stderr: msg}
	}
	return stdout.Bytes(), nil
}

type toolError struct {
	tool   []string
	err    error
	stderr string
}

func (e *toolError) Error() string {
	return fmt.Sprintf("running %s: %v: %s", strings.Join(e.tool, " "), e.err, e.stderr)
}

func (e *toolError) Unwrap() error { return e.err }

var restoreFailedLine = regexp.MustCompile(`line:? (\d+)`)

// withLine appends the input line a restore tool complained about.
func withLine(err error, data []byte) error {
	var te *toolError
	if !errors.As(err, &te) {
		return err
	}
	g := restoreFailedLine.FindStringSubmatch(te.stderr)
	if g == nil {
		return err
	}
	n, _ := strconv.Atoi(g[1])
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for i := 1; sc.Scan(); i++ {
		if i == n {
			return fmt.Errorf("%w (line %d: %q)", err, n, sc.Text())
		}
	}
	return err
}

// IPTablesRestore implements Rules.
func (e *Exec) IPTablesRestore(ctx context.Context, family Family, data []byte) error {
	_, err := e.run(ctx, data, e.iptables(family, "-restore"), "--noflush", "--wait")
	return withLine(err, data)
}

// IPTablesSave implements Rules.
func (e *Exec) IPTablesSave(ctx context.Context, family Family, table string) ([]byte, error) {
	return e.run(ctx, nil, e.iptables(family, "-save"), "-t", table)
}

// IPTablesVersion implements Rules.
func (e *Exec) IPTablesVersion(ctx context.Context) (string, error) {
	out, err := e.run(ctx, nil, e.iptables(IPv4, ""), "--version")
	return strings.TrimSpace(string(out)), err
}

// IPSetRestore implements Rules.
func (e *Exec) IPSetRestore(ctx context.Context, data []byte) error {
	_, err := e.run(ctx, data, "ipset", "-exist", "restore")
	return classifyIPSet(withLine(err, data))
}

// IPSetSave implements Rules.
func (e *Exec) IPSetSave(ctx context.Context) ([]byte, error) {
	return e.run(ctx, nil, "ipset", "save")
}

// IPSetDestroy implements Rules.
func (e *Exec) IPSetDestroy(ctx context.Context, name string) error {
	_, err := e.run(ctx, nil, "ipset", "destroy", name)
	return classifyIPSet(err)
}

// classifyIPSet wraps the sentinel errors ipset's messages stand for.
func classifyIPSet(err error) error {
	var te *toolError
	if err == nil || !errors.As(err, &te) {
		return err
	}
	switch {
	case strings.Contains(te.stderr, "does not exist"):
		return fmt.Errorf("%w: %w", ErrNoSet, err)
	case strings.Contains(te.stderr, "in use by a kernel component"):
		return fmt.Errorf("%w: %w", ErrSetInUse, err)
	}
	return err
}
