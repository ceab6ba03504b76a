package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/svcproxy/svcproxy/internal/topology"
)

// dnsLoad is one dnsperf run: queries answered per second, the share lost
// (no answer within a second), and the latency of the answered ones.
type dnsLoad struct {
	QPS        float64
	Sent, Lost int64
	P50, P99   time.Duration
}

func (l *dnsLoad) lossPct() float64 {
	if l.Sent == 0 {
		return 0
	}
	return 100 * float64(l.Lost) / float64(l.Sent)
}

// dnsName is what the backends' dnsmasq answers for (--address).
const dnsName = "svc.bench"

// runDNSPerf runs dnsperf from h against target for d: 16 clients with up
// to 200 queries outstanding, at most rate queries/s (0: as fast as
// answers come), one second for an answer. It reads dnsperf's summary for
// the counts and its verbose per-query lines for the latency percentiles.
func runDNSPerf(ctx context.Context, e *Env, h *topology.Host, target netip.AddrPort, d time.Duration, rate int) (*dnsLoad, error) {
	queries := filepath.Join(e.Scratch, "dns-queries.txt")
	if _, err := os.Stat(queries); err != nil {
		if err := os.WriteFile(queries, []byte(dnsName+" A\n"), 0o644); err != nil {
			return nil, err
		}
	}
	args := []string{"-s", target.Addr().String(), "-p", strconv.Itoa(int(target.Port())), "-d", queries,
		"-l", strconv.Itoa(int(d.Seconds())), "-c", "16", "-T", "1", "-q", "200", "-t", "1", "-v"}
	if rate > 0 {
		args = append(args, "-Q", strconv.Itoa(rate))
	}
	out, err := h.Command(ctx, e.Tools.Dnsperf, args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("dnsperf %s: %v: %s", strings.Join(args, " "), err, lastLines(out, 5))
	}
	l, err := parseDNSPerf(out)
	if err != nil {
		return nil, fmt.Errorf("dnsperf %s: %w", strings.Join(args, " "), err)
	}
	return l, nil
}

// parseDNSPerf reads dnsperf's output (with -v): "> NOERROR name A 0.000123"
// for each answer, then the statistics block.
func parseDNSPerf(out []byte) (*dnsLoad, error) {
	l := &dnsLoad{}
	var lat []time.Duration
	var haveQPS, haveSent bool
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "> "):
			f := strings.Fields(line)
			if s, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil && len(f) >= 3 {
				lat = append(lat, time.Duration(s*float64(time.Second)))
			}
		case strings.HasPrefix(line, "Queries sent:"):
			n, err := strconv.ParseInt(firstField(line, "Queries sent:"), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("reading %q: %w", line, err)
			}
			l.Sent, haveSent = n, true
		case strings.HasPrefix(line, "Queries lost:"):
			n, err := strconv.ParseInt(firstField(line, "Queries lost:"), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("reading %q: %w", line, err)
			}
			l.Lost = n
		case strings.HasPrefix(line, "Queries per second:"):
			q, err := strconv.ParseFloat(firstField(line, "Queries per second:"), 64)
			if err != nil {
				return nil, fmt.Errorf("reading %q: %w", line, err)
			}
			l.QPS, haveQPS = q, true
		}
	}
	if !haveQPS || !haveSent {
		return nil, fmt.Errorf("no statistics in its output: %s", lastLines(out, 5))
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		l.P50 = lat[len(lat)*50/100]
		l.P99 = lat[min(len(lat)-1, len(lat)*99/100)]
	}
	return l, nil
}

func firstField(line, prefix string) string {
	f := strings.Fields(strings.TrimPrefix(line, prefix))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}
