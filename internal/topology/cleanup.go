package topology

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
)

// Cleanup deletes the namespaces that crashed runs left behind: those named
// prefix + "<pid>-<6 hex digits>-<role>" (role node, clientN or backendN)
// whose pid is no running process. Namespaces of live runs, this process's
// included, and names of any other shape are left alone. It kills processes
// still inside the namespaces it deletes. Empty prefix: DefaultPrefix.
func Cleanup(prefix string) error {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !prefixRE.MatchString(prefix) {
		return fmt.Errorf("topology: prefix %q: want 1 to 64 letters, digits, '.', '_' or '-'", prefix)
	}
	names, err := leftovers(prefix)
	if err != nil || len(names) == 0 {
		return err
	}
	if err := supported(); err != nil {
		return err
	}
	_, err = deleteNamespaces(names)
	return err
}

// leftovers lists the namespaces Cleanup(prefix) would delete.
func leftovers(prefix string) ([]string, error) {
	ents, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("topology: listing namespaces: %w", err)
	}
	re := nameRE(prefix)
	var names []string
	for _, e := range ents {
		m := re.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil || pid == os.Getpid() || pidAlive(pid) {
			continue
		}
		names = append(names, e.Name())
	}
	return names, nil
}

// nameRE matches the namespace names New makes with prefix; group 1 is the
// pid of the process that made them.
func nameRE(prefix string) *regexp.Regexp {
	return regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `([1-9][0-9]*)-[0-9a-f]{6}-(?:node|client[0-9]+|backend[0-9]+)$`)
}
