package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Env is what every mode and test of one run shares: the settings, the
// binaries, the tools found on this machine and a scratch directory.
type Env struct {
	Cfg      Config
	Svcproxy string // the svcproxy binary
	Backend  string // the svcproxy-backend binary
	Tools    Tools
	Scratch  string // removed at the end of the run
	// FileLimit is the open-files limit every process gets; IdleWanted the
	// idle connections asked for (Cfg.IdleConns may be fewer to fit it).
	FileLimit  uint64
	IdleWanted int
	Prog       *progress
}

// Tools are the external programs the suite uses: their paths ("" when not
// installed) and versions.
type Tools struct {
	Wrk, Iperf3, HAProxy, Nginx, Strace, Perf string
	IPTables, IPTablesLegacyRestore           string
	IPSet                                     string
	Dnsperf, Dnsmasq                          string // the UDP (DNS) test's load generator and backends
	// NginxStream is how nginx gets its stream module: a load_module path,
	// "static" when compiled in, "" when it has none.
	NginxStream string
	Versions    map[string]string
}

// useWrk and useIperf tell whether the real load generators are used.
func (e *Env) useWrk() bool   { return e.Tools.Wrk != "" && e.Cfg.Loadgen == "auto" }
func (e *Env) useIperf() bool { return e.Tools.Iperf3 != "" && e.Cfg.Loadgen == "auto" }

// httpBackend names the HTTP server in backend0: Debian's nginx when
// installed, else the repo's Go svcproxy-backend.
func (e *Env) httpBackend() string {
	if e.Tools.Nginx != "" {
		return "nginx"
	}
	return "svcproxy-backend"
}

// preflight says why this machine cannot run the suite at all.
func preflight() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (network namespaces, iptables inside them): run it with sudo")
	}
	for _, tool := range []string{"ip", "iptables", "ipset"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is not installed (see the README's bench set-up)", tool)
		}
	}
	return nil
}

func findTools(ctx context.Context) Tools {
	look := func(name string) string {
		p, err := exec.LookPath(name)
		if err != nil {
			return ""
		}
		return p
	}
	t := Tools{
		Wrk: look("wrk"), Iperf3: look("iperf3"), HAProxy: look("haproxy"), Nginx: look("nginx"),
		Strace: look("strace"), Perf: look("perf"), IPTables: look("iptables"), IPTablesLegacyRestore: look("iptables-legacy-restore"),
		IPSet: look("ipset"), Dnsperf: look("dnsperf"), Dnsmasq: look("dnsmasq"),
		Versions: map[string]string{},
	}
	version := func(key, bin string, args ...string) {
		if bin == "" {
			return
		}
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		out, _ := exec.CommandContext(c, bin, args...).CombinedOutput() // some print their version and exit 1
		line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		if line != "" {
			t.Versions[key] = strings.TrimSpace(line)
		}
	}
	version("wrk", t.Wrk, "-v")
	version("iperf3", t.Iperf3, "-v")
	version("haproxy", t.HAProxy, "-v")
	version("nginx", t.Nginx, "-v")
	version("strace", t.Strace, "-V")
	version("iptables", t.IPTables, "--version")
	version("iptables-legacy", look("iptables-legacy"), "--version")
	version("ipset", t.IPSet, "--version")
	version("dnsperf", t.Dnsperf, "-h") // prints "Version 2.10.0" last; the first line is its usage
	version("dnsmasq", t.Dnsmasq, "--version")
	version("go", look("go"), "version")
	if t.Nginx != "" {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		out, _ := exec.CommandContext(c, t.Nginx, "-V").CombinedOutput()
		cancel()
		switch s := string(out); {
		case strings.Contains(s, "--with-stream=dynamic"):
			for _, p := range []string{"/usr/lib/nginx/modules/ngx_stream_module.so", "/usr/share/nginx/modules/ngx_stream_module.so"} {
				if _, err := os.Stat(p); err == nil {
					t.NginxStream = p
					break
				}
			}
		case strings.Contains(s, "--with-stream"):
			t.NginxStream = "static"
		}
	}
	return t
}

// buildBinaries builds svcproxy and svcproxy-backend from the module the
// working directory is in, unless given.
func buildBinaries(ctx context.Context, e *Env) error {
	for _, b := range []struct {
		path *string
		pkg  string
		flag string
	}{
		{&e.Svcproxy, "github.com/svcproxy/svcproxy/cmd/svcproxy", "--svcproxy"},
		{&e.Backend, "github.com/svcproxy/svcproxy/cmd/svcproxy-backend", "--backend"},
	} {
		if *b.path != "" {
			abs, err := filepath.Abs(*b.path)
			if err != nil {
				return err
			}
			if st, err := os.Stat(abs); err != nil || st.IsDir() {
				return fmt.Errorf("%s %s: not a binary (%v)", b.flag, *b.path, err)
			}
			*b.path = abs
			continue
		}
		out := filepath.Join(e.Scratch, filepath.Base(b.pkg))
		e.Prog.phase("building " + filepath.Base(b.pkg))
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, b.pkg)
		var buf bytes.Buffer
		cmd.Stdout, cmd.Stderr = &buf, &buf
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("building %s (run from inside the svcproxy module, or pass %s): %v\n%s", b.pkg, b.flag, err, buf.String())
		}
		*b.path = out
	}
	return nil
}

// raiseFileLimit lets this process and every process it starts hold the
// connections of the idle-connection test (a proxy holds two descriptors
// per connection). syscall.Setrlimit also makes children inherit it. Without
// CAP_SYS_RESOURCE the hard limit cannot be raised: it then raises the soft
// limit to the hard one and returns that.
func raiseFileLimit(n uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur >= n && lim.Max >= n {
		return lim.Cur, nil
	}
	want := syscall.Rlimit{Cur: max(lim.Cur, n), Max: max(lim.Max, n)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err == nil {
		return want.Cur, nil
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("raising the open-files limit: %w", err)
	}
	return lim.Cur, nil
}

// errSkip marks why a mode or test does not run here; it is reported, not
// counted as a failure.
var errSkip = errors.New("skipped")

func skipf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errSkip, fmt.Sprintf(format, args...))
}

// skipReason is err's text without the sentinel's prefix.
func skipReason(err error) string {
	return strings.TrimPrefix(err.Error(), errSkip.Error()+": ")
}
