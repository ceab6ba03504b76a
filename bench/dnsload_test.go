package main

import (
	"testing"
	"time"
)

func TestParseDNSPerf(t *testing.T) {
	out := `DNS Performance Testing Tool
[Status] Sending queries (to 198.19.0.12:53)
> NOERROR svc.bench A 0.000200
> NOERROR svc.bench A 0.000100
> NOERROR svc.bench A 0.000400
> NOERROR svc.bench A 0.000300
[Timeout] Query timed out: msg id 7
Statistics:

  Queries sent:         5
  Queries completed:    4 (80.00%)
  Queries lost:         1 (20.00%)

  Response codes:       NOERROR 4 (100.00%)
  Run time (s):         2.002150
  Queries per second:   31257.398297

  Average Latency (s):  0.002528 (min 0.000030, max 0.097943)
`
	l, err := parseDNSPerf([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if l.Sent != 5 || l.Lost != 1 || l.QPS != 31257.398297 || l.lossPct() != 20 {
		t.Errorf("got %+v (loss %v%%)", l, l.lossPct())
	}
	if l.P50 != 300*time.Microsecond || l.P99 != 400*time.Microsecond {
		t.Errorf("p50 %v, p99 %v; want 300µs, 400µs", l.P50, l.P99)
	}
	if _, err := parseDNSPerf([]byte("dnsperf: error: no such host\n")); err == nil {
		t.Error("output without statistics parsed")
	}
}
