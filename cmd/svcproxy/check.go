package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/svcproxy/svcproxy/examples"
	"github.com/svcproxy/svcproxy/source/file"
)

// check is --check, as `nginx -t` or `haproxy -c`: it validates what the
// flags point at — the services file (--services; the embedded example
// when no cluster is the source) and the configuration file (--config,
// which parseFlags has read) — and writes to w what it found, every
// problem on a line of its own with its line in the file. The error counts
// the problems; nil means svcproxy would start with these files.
func check(o *options, w io.Writer) error {
	problems := 0
	report := func(what string, err error, ok string) {
		if err == nil {
			fmt.Fprintf(w, "%s: ok%s\n", what, ok)
			return
		}
		lines := strings.Split(err.Error(), "\n")
		problems += len(lines)
		fmt.Fprintf(w, "%s: %d problem(s):\n", what, len(lines))
		for _, l := range lines {
			fmt.Fprintf(w, "  %s\n", l)
		}
	}

	cluster := o.kubeconfig != "" || o.master != "" || o.inCluster // as run decides
	switch {
	case o.services != "":
		n, err := checkServices(o.services)
		note := fmt.Sprintf(" (%d service ports)", n)
		if cluster {
			note += ", but unused: Services come from the cluster"
		}
		report("services file "+o.services, err, note)
	case cluster:
		fmt.Fprintln(w, "services: from the cluster, nothing to check")
	default:
		n, err := countServices(examples.Services)
		report("embedded example services file", err, fmt.Sprintf(" (%d service ports)", n))
	}
	if o.configFile != "" {
		report("configuration file "+o.configFile, o.configErr, "")
	} else {
		fmt.Fprintln(w, "configuration file: none given (--config)")
	}
	if problems > 0 {
		return fmt.Errorf("--check: %d problem(s); svcproxy would not start with these files", problems)
	}
	return nil
}

// checkServices reads and parses the services file at path as a load
// does: it returns the Service ports the file holds, or everything wrong
// with it, one problem per line of the error.
func checkServices(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("reading services file: %w", err)
	}
	return countServices(data)
}

func countServices(data []byte) (int, error) {
	services, err := file.Parse(data)
	if err != nil {
		return 0, err
	}
	return len(services), nil
}
