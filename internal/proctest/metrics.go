package proctest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Samples are the series of a Prometheus text exposition, one
// `series value` line each, in order.
type Samples []string

// Scrape GETs url (http://127.0.0.1:10249/metrics, say) over dial, which
// may reach into a namespace (topology.Host.Dial), and fails tb when it
// cannot.
func Scrape(tb testing.TB, dial func(ctx context.Context, network, addr string) (net.Conn, error), url string) Samples {
	tb.Helper()
	hc := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}
	resp, err := hc.Get(url)
	if err != nil {
		tb.Fatalf("reading metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("reading metrics: %v", err)
	}
	var s Samples
	for _, line := range strings.Split(string(body), "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			s = append(s, line)
		}
	}
	return s
}

// Value is the first sample of the series exactly named series (labels
// included, as exposed: name{a="x",b="y"}); 0 when there is none.
func (s Samples) Value(series string) float64 {
	for _, line := range s {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, _ := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v
		}
	}
	return 0
}

// Sum adds the series whose name, or name with labels as exposed, is
// want, or which have want's name and at least its labels; a want without
// labels sums every series of that name.
func (s Samples) Sum(want string) float64 {
	var sum float64
	for _, line := range s {
		series, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if series == want || (!strings.Contains(want, "{") && strings.HasPrefix(series, want+"{")) || hasLabels(series, want) {
			v, _ := strconv.ParseFloat(strings.TrimSpace(value), 64)
			sum += v
		}
	}
	return sum
}

// hasLabels says whether series (name{a="x",b="y"}) has the name of want
// and every label of it.
func hasLabels(series, want string) bool {
	wname, wlabels, ok := strings.Cut(want, "{")
	sname, slabels, _ := strings.Cut(series, "{")
	if !ok || wname != sname {
		return false
	}
	have := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSuffix(slabels, "}"), ",") {
		have[l] = true
	}
	for _, l := range strings.Split(strings.TrimSuffix(wlabels, "}"), ",") {
		if !have[l] {
			return false
		}
	}
	return true
}

// Parallel runs fn for 0..n-1 on w workers and returns the failures, each
// prefixed with its i, in the order they happened.
func Parallel(n, w int, fn func(i int) error) []error {
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	next := make(chan int)
	for range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(i); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("%d: %w", i, err))
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return errs
}
