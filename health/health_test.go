package health

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestHealthz(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	tests := []struct {
		name         string
		setup        func(*Tracker)
		wantCode     int
		wantHealthy  bool // the body's "healthy": the proxy rules' health
		wantEligible bool
	}{
		{"nothing queued", func(*Tracker) {}, 200, true, true},
		{"queued recently", func(tr *Tracker) { tr.Queued(); now = now.Add(5 * time.Second) }, 200, true, true},
		{"queued too long", func(tr *Tracker) { tr.Queued(); now = now.Add(61 * time.Second) }, 503, false, true},
		{"queued long ago but applied", func(tr *Tracker) { tr.Queued(); now = now.Add(61 * time.Second); tr.Applied() }, 200, true, true},
		{"node not eligible", func(tr *Tracker) { tr.SetNodeEligible(false) }, 503, true, false},
		{"node eligible again", func(tr *Tracker) { tr.SetNodeEligible(false); tr.SetNodeEligible(true) }, 200, true, true},
		{"lagging and not eligible", func(tr *Tracker) { tr.Queued(); now = now.Add(2 * time.Minute); tr.SetNodeEligible(false) }, 503, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			m := NewMetrics(reg)
			tr := NewTracker(time.Minute, clock)
			tc.setup(tr)
			rec := httptest.NewRecorder()
			Handler(tr, m).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
			if rec.Code != tc.wantCode {
				t.Fatalf("code = %d, want %d; body %s", rec.Code, tc.wantCode, rec.Body)
			}
			var body map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if body["healthy"] != tc.wantHealthy || body["nodeEligible"] != tc.wantEligible {
				t.Errorf("body %s: want healthy %v, nodeEligible %v", rec.Body, tc.wantHealthy, tc.wantEligible)
			}
			for _, k := range []string{"lastUpdated", "currentTime"} {
				if _, ok := body[k]; !ok {
					t.Errorf("body %s lacks %s", rec.Body, k)
				}
			}
			if len(body) != 4 {
				t.Errorf("body %s: want exactly kube-proxy's lastUpdated, currentTime, nodeEligible, healthy", rec.Body)
			}
			if tc.wantCode == 200 && body["lastUpdated"] != body["currentTime"] {
				t.Errorf("healthy body %s: lastUpdated should be now, as kube-proxy says", rec.Body)
			}
			for _, code := range []string{"200", "503"} {
				want := 0.0
				if code == strconv.Itoa(tc.wantCode) {
					want = 1
				}
				if got := testutil.ToFloat64(m.healthz.WithLabelValues(code)); got != want {
					t.Errorf("kubeproxy_proxy_healthz_total{code=%q} = %v, want %v", code, got, want)
				}
			}
		})
	}
}

// TestStatusLeavesEligibilityOut: the health-check node ports use the
// proxy rules' health alone, as kube-proxy's do.
func TestStatusLeavesEligibilityOut(t *testing.T) {
	tr := NewTracker(time.Minute, nil)
	tr.SetNodeEligible(false)
	if st := tr.Status(); !st.Healthy || st.NodeEligible != nil {
		t.Fatalf("Status() = %+v, want healthy with no nodeEligible", st)
	}
}

// TestCountsOverHTTP serves the handler on a loopback socket and counts
// each answer.
func TestCountsOverHTTP(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	tr := NewTracker(time.Minute, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: Handler(tr, m)}
	go srv.Serve(ln) //nolint:errcheck // closed below
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + ln.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(body)
	}
	for i := 0; i < 3; i++ {
		get("/healthz")
	}
	tr.SetNodeEligible(false)
	if code, _ := get("/healthz"); code != 503 {
		t.Fatalf("/healthz on an ineligible node = %d, want 503", code)
	}
	if code, body := get("/livez"); code != 200 || body != "ok\n" {
		t.Fatalf("/livez = %d %q, want 200 ok", code, body)
	}
	for _, c := range []struct {
		v    *prometheus.CounterVec
		code string
		want float64
	}{{m.healthz, "200", 3}, {m.healthz, "503", 1}, {m.livez, "200", 1}} {
		if got := testutil.ToFloat64(c.v.WithLabelValues(c.code)); got != c.want {
			t.Errorf("code %s: %v, want %v", c.code, got, c.want)
		}
	}
}
