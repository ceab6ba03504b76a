package topology

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// ipTimeout bounds one `ip` run, so a wedged kernel cannot hang a test.
const ipTimeout = 30 * time.Second

var batchLineRE = regexp.MustCompile(`Command failed -:(\d+)`)

// ipBatch runs script (one `ip` command a line, without the leading "ip")
// as `ip [-n ns] [flags] -batch -`: one process for many changes. Its error
// names the failing line and carries ip's stderr; it wraps ErrUnsupported
// when the kernel refuses what was asked for lack of permission or support.
func ipBatch(ns, script string, flags ...string) error {
	var args []string
	if ns != "" {
		args = append(args, "-n", ns)
	}
	args = append(args, flags...)
	args = append(args, "-batch", "-")

	ctx, cancel := context.WithTimeout(context.Background(), ipTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Stdin = strings.NewReader(script)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	if err == nil {
		return nil
	}
	msg := strings.TrimSpace(out.String())
	where := ""
	if m := batchLineRE.FindStringSubmatch(msg); m != nil {
		if n, _ := strconv.Atoi(m[1]); n >= 1 {
			if lines := strings.Split(script, "\n"); n <= len(lines) {
				where = fmt.Sprintf(" at %q", lines[n-1])
			}
		}
	} else if n := strings.Count(script, "\n"); n == 1 {
		where = fmt.Sprintf(" at %q", strings.TrimSuffix(script, "\n"))
	}
	err = fmt.Errorf("ip %s%s: %w: %s", strings.Join(args, " "), where, err, msg)
	if unsupportedMsg(msg) {
		err = fmt.Errorf("%w: %w", ErrUnsupported, err)
	}
	return err
}

// unsupportedMsg tells whether ip's output says the kernel or our privileges,
// not the request, are at fault.
func unsupportedMsg(msg string) bool {
	for _, s := range []string{
		"Operation not permitted",
		"Permission denied",
		"Unknown device type",
		"Operation not supported",
	} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
