package health

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestHealthz(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	tests := []struct {
		name     string
		setup    func(*Tracker)
		wantCode int
	}{
		{"nothing queued", func(*Tracker) {}, 200},
		{"queued recently", func(tr *Tracker) { tr.Queued(); now = now.Add(5 * time.Second) }, 200},
		{"queued too long", func(tr *Tracker) { tr.Queued(); now = now.Add(61 * time.Second) }, 503},
		{"queued long ago but applied", func(tr *Tracker) { tr.Queued(); now = now.Add(61 * time.Second); tr.Applied() }, 200},
		{"node deleting", func(tr *Tracker) { tr.SetNodeDeleting(true) }, 503},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTracker(time.Minute, clock)
			tc.setup(tr)
			rec := httptest.NewRecorder()
			Handler(tr).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
			if rec.Code != tc.wantCode {
				t.Fatalf("code = %d, want %d; body %s", rec.Code, tc.wantCode, rec.Body)
			}
			var st Status
			if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if st.Healthy != (tc.wantCode == 200) {
				t.Errorf("healthy = %v with code %d", st.Healthy, rec.Code)
			}
		})
	}
}

func TestLivez(t *testing.T) {
	rec := httptest.NewRecorder()
	Handler(NewTracker(time.Minute, nil)).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/livez", nil))
	if rec.Code != 200 {
		t.Fatalf("livez code = %d", rec.Code)
	}
}
