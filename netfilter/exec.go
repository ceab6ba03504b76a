package netfilter

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
	"sync"

	"github.com/svcproxy/svcproxy/netfilter/internal/model"
)

// Family is an IP address family.
type Family = model.Family

// The families. IPv4 is always programmed; IPv6 when Config.IPv6 is set.
const (
	IPv4 = model.IPv4
	IPv6 = model.IPv6
)

// Executor runs the kernel tools. It is exactly what svcproxy's modes call:
// Exec is the real one, netfiltertest.Fake the in-memory one tests use.
type Executor interface {
	// IPTablesRestore feeds data to iptables-restore (ip6tables-restore for
	// IPv6) with --noflush --wait: only the chains data declares are
	// flushed. data may hold several tables (*nat ... COMMIT *filter ...
	// COMMIT), so one call writes a family's whole rule set.
	IPTablesRestore(ctx context.Context, family Family, data []byte) error
	// IPTablesSave returns `iptables-save -t table` (ip6tables-save for IPv6).
	IPTablesSave(ctx context.Context, family Family, table string) ([]byte, error)
	// IPTablesSaveChains returns what IPTablesSave prints for the named
	// chains of table only (`iptables -t table -S chain` each, in save
	// format), so a few small chains can be read without dumping a table of
	// 100,000 rules. A chain that cannot be listed (it does not exist) is
	// left out.
	IPTablesSaveChains(ctx context.Context, family Family, table string, chains []string) ([]byte, error)
	// IPTablesVersion returns `iptables --version`, e.g.
	// "iptables v1.8.9 (nf_tables)".
	IPTablesVersion(ctx context.Context) (string, error)
	// IPSetRestore feeds data to `ipset restore -exist`: adding a member
	// that is there, deleting one that is not, and creating a set that
	// exists with the same parameters are no-ops. (The flag is global
	// because ipset batches consecutive lines for one set and honours a
	// line's own -exist only when it starts the batch.) Lines apply in
	// order; the first failing line stops it, earlier lines stay applied.
	IPSetRestore(ctx context.Context, data []byte) error
	// IPSetList returns the members of the named set as ipset prints them.
	// A missing set returns an error wrapping ErrNoSet.
	IPSetList(ctx context.Context, name string) ([]string, error)
	// IPSetSave returns `ipset save`: the create and add lines of every
	// set.
	IPSetSave(ctx context.Context) ([]byte, error)
	// IPSetNames returns the names of every set.
	IPSetNames(ctx context.Context) ([]string, error)
	// IPSetDestroy destroys the named set: ErrNoSet when it does not exist,
	// ErrSetInUse when a rule still references it.
	IPSetDestroy(ctx context.Context, name string) error
}

// Exec runs the real tools with exec.CommandContext. The zero value runs the
// iptables on PATH in the caller's network namespace.
type Exec struct {
	// NetNS, when set, runs every tool as `ip netns exec NetNS tool ...`.
	NetNS string
	// Variant picks the iptables binaries: "" the iptables-restore etc. on
	// PATH (whatever the node uses), "legacy" iptables-legacy-*, "nft"
	// iptables-nft-*.
	Variant string
}

// spawned remembers the pids of this process's last tool runs, whichever
// Exec ran them.
var spawned struct {
	mu   sync.Mutex
	pids [64]uint32
	next int
}

// Spawned reports whether pid is one of the last 64 tools this process ran
// through an Exec: a ruleset change it made is svcproxy's own
// (WatchConfig.Own).
func Spawned(pid uint32) bool {
	spawned.mu.Lock()
	defer spawned.mu.Unlock()
	for _, p := range spawned.pids {
		if p == pid && p != 0 {
			return true
		}
	}
	return false
}

// NewExec returns the real Executor, running the tools inside the named
// network namespace when netns is not empty.
func NewExec(netns string) *Exec { return &Exec{NetNS: netns} }

var _ Executor = (*Exec)(nil)

// Tool names the iptables binary tool ("", "-restore", "-save") runs for
// family and e.Variant, e.g. "ip6tables-legacy-save".
func (e *Exec) Tool(family Family, tool string) string {
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
	err := cmd.Start()
	if err == nil {
		spawned.mu.Lock()
		spawned.pids[spawned.next] = uint32(cmd.Process.Pid)
		spawned.next = (spawned.next + 1) % len(spawned.pids)
		spawned.mu.Unlock()
		err = cmd.Wait()
	}
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 1000 {
			msg = msg[:1000] + "..."
		}
		return stdout.Bytes(), &toolError{tool: cmd.Args[0:min(len(cmd.Args), 5)], err: err, stderr: msg}
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

// withLine appends the input line a restore tool complained about, so the
// error names the rule or member, not just a line number.
func withLine(err error, data []byte) error {
	var te *toolError
	if !errors.As(err, &te) {
		return err
	}
	m := restoreFailedLine.FindStringSubmatch(te.stderr)
	if m == nil {
		return err
	}
	n, _ := strconv.Atoi(m[1])
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for i := 1; sc.Scan(); i++ {
		if i == n {
			return fmt.Errorf("%w (line %d: %q)", err, n, sc.Text())
		}
	}
	return err
}

// IPTablesRestore implements Executor.
func (e *Exec) IPTablesRestore(ctx context.Context, family Family, data []byte) error {
	_, err := e.run(ctx, data, e.Tool(family, "-restore"), "--noflush", "--wait")
	return withLine(err, data)
}

// IPTablesSave implements Executor.
func (e *Exec) IPTablesSave(ctx context.Context, family Family, table string) ([]byte, error) {
	return e.run(ctx, nil, e.Tool(family, "-save"), "-t", table)
}

// IPTablesSaveChains implements Executor.
func (e *Exec) IPTablesSaveChains(ctx context.Context, family Family, table string, chains []string) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("*" + table + "\n")
	var rules []byte
	for _, c := range chains {
		out, err := e.run(ctx, nil, e.Tool(family, ""), "-w", "-t", table, "-S", c)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			continue // missing (nf_tables and legacy word it differently)
		}
		for _, line := range strings.Split(string(out), "\n") {
			switch f := strings.Fields(line); {
			case len(f) == 3 && f[0] == "-P": // a built-in chain and its policy
				fmt.Fprintf(&b, ":%s %s [0:0]\n", f[1], f[2])
			case len(f) == 2 && f[0] == "-N":
				fmt.Fprintf(&b, ":%s - [0:0]\n", f[1])
			case len(f) > 2 && f[0] == "-A":
				rules = append(append(rules, line...), '\n')
			}
		}
	}
	b.Write(rules)
	b.WriteString("COMMIT\n")
	return b.Bytes(), nil
}

// IPTablesVersion implements Executor.
func (e *Exec) IPTablesVersion(ctx context.Context) (string, error) {
	out, err := e.run(ctx, nil, e.Tool(IPv4, ""), "--version")
	return strings.TrimSpace(string(out)), err
}

// IPSetRestore implements Executor.
func (e *Exec) IPSetRestore(ctx context.Context, data []byte) error {
	_, err := e.run(ctx, data, "ipset", "-exist", "restore")
	return classifyIPSet(withLine(err, data))
}

// IPSetList implements Executor. It reads `ipset save NAME`.
func (e *Exec) IPSetList(ctx context.Context, name string) ([]string, error) {
	out, err := e.run(ctx, nil, "ipset", "save", name)
	if err != nil {
		return nil, classifyIPSet(err)
	}
	var members []string
	prefix := "add " + name + " "
	for line := range strings.Lines(string(out)) {
		if m, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			members = append(members, m)
		}
	}
	return members, nil
}

// IPSetSave implements Executor.
func (e *Exec) IPSetSave(ctx context.Context) ([]byte, error) {
	return e.run(ctx, nil, "ipset", "save")
}

// IPSetNames implements Executor.
func (e *Exec) IPSetNames(ctx context.Context) ([]string, error) {
	out, err := e.run(ctx, nil, "ipset", "list", "-n")
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(out)), nil
}

// IPSetDestroy implements Executor.
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
