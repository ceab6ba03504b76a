package kerneltest

import (
	"errors"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// Variants are the iptables backends the privileged tests run against: ""
// for the one on PATH (nf_tables here) and "legacy", when installed.
func Variants() []string {
	v := []string{""}
	if _, err := exec.LookPath("iptables-legacy-restore"); err == nil {
		v = append(v, "legacy")
	}
	return v
}

// VariantName names a variant in subtest names: "default" for "".
func VariantName(v string) string {
	if v == "" {
		return "default"
	}
	return v
}

var (
	counters = regexp.MustCompile(`\[\d+:\d+\]`)
	initvals = regexp.MustCompile(` initval 0x[0-9a-f]+`)
)

// State is what namespace ns's nat and filter tables (both families, as
// the variant's iptables-save prints them) and its ipsets look like, with
// comments, counters and initvals stripped: text to compare before and
// after. It reads with the tools themselves, not through the code under
// test.
func State(tb testing.TB, ns, variant string) string {
	tb.Helper()
	var b strings.Builder
	for _, tool := range []string{"iptables", "ip6tables"} {
		if variant != "" {
			tool += "-" + variant
		}
		for _, tbl := range []string{"nat", "filter"} {
			out, err := exec.Command("ip", "netns", "exec", ns, tool+"-save", "-t", tbl).Output()
			if err != nil {
				tb.Fatalf("%s -t %s in %s: %v", tool+"-save", tbl, ns, errors.Join(err, stderr(err)))
			}
			for line := range strings.Lines(string(out)) {
				if !strings.HasPrefix(line, "#") {
					b.WriteString(counters.ReplaceAllString(line, "[0:0]"))
				}
			}
		}
	}
	b.WriteString(initvals.ReplaceAllString(Run(tb, "ip", "netns", "exec", ns, "ipset", "save"), ""))
	return b.String()
}

// stderr is what a failed command said, when it said anything.
func stderr(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return errors.New(strings.TrimSpace(string(ee.Stderr)))
	}
	return nil
}
