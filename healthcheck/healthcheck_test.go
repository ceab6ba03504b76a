package healthcheck

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

var loopback = []netip.Addr{netip.MustParseAddr("127.0.0.1")}

// freePort returns a TCP port free on 127.0.0.1 right now.
func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

type reply struct {
	code   int
	weight string
	body   status
}

func get(t *testing.T, port uint16) (reply, error) {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var r reply
	r.code, r.weight = resp.StatusCode, resp.Header.Get("X-Load-Balancing-Endpoint-Weight")
	if err := json.Unmarshal(data, &r.body); err != nil {
		t.Fatalf("body %q: %v", data, err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	return r, nil
}

func TestServer(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	s := New(Config{Addresses: loopback, Healthy: healthy.Load})
	defer s.Close()
	web := ServiceName{"ns", "web"}
	port := freePort(t)

	if err := s.Sync(map[ServiceName]Service{web: {Port: port}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		endpoints int
		healthy   bool
		code      int
	}{
		{"no local endpoints: 503", 0, true, http.StatusServiceUnavailable},
		{"local endpoints: 200", 2, true, http.StatusOK},
		{"proxy unhealthy: 503 despite endpoints", 2, false, http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			healthy.Store(tc.healthy)
			if err := s.Sync(map[ServiceName]Service{web: {Port: port, LocalEndpoints: tc.endpoints}}); err != nil {
				t.Fatal(err)
			}
			r, err := get(t, port)
			if err != nil {
				t.Fatal(err)
			}
			want := reply{code: tc.code, weight: fmt.Sprint(tc.endpoints)}
			want.body.Service.Namespace, want.body.Service.Name = "ns", "web"
			want.body.LocalEndpoints, want.body.ServiceProxyHealthy = tc.endpoints, tc.healthy
			if r != want {
				t.Errorf("got %+v, want %+v", r, want)
			}
		})
	}

	t.Run("a changed port moves the listener", func(t *testing.T) {
		healthy.Store(true)
		port2 := freePort(t)
		if err := s.Sync(map[ServiceName]Service{web: {Port: port2, LocalEndpoints: 1}}); err != nil {
			t.Fatal(err)
		}
		if r, err := get(t, port2); err != nil || r.code != http.StatusOK {
			t.Errorf("new port: %+v, %v", r, err)
		}
		if _, err := get(t, port); err == nil {
			t.Error("old port still answers")
		}
		port = port2
	})

	t.Run("a port in use is reported; the other Services are served", func(t *testing.T) {
		busy, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer busy.Close()
		other := ServiceName{"ns", "other"}
		err = s.Sync(map[ServiceName]Service{
			web:   {Port: port, LocalEndpoints: 1},
			other: {Port: uint16(busy.Addr().(*net.TCPAddr).Port), LocalEndpoints: 1},
		})
		if err == nil || !strings.Contains(err.Error(), "ns/other") {
			t.Errorf("Sync error %v, want one naming ns/other", err)
		}
		if r, err := get(t, port); err != nil || r.code != http.StatusOK {
			t.Errorf("web: %+v, %v", r, err)
		}
		if got := s.Services(); len(got) != 1 {
			t.Errorf("Services() = %v, want only web", got)
		}
	})

	t.Run("removed: the port closes", func(t *testing.T) {
		if err := s.Sync(nil); err != nil {
			t.Fatal(err)
		}
		if _, err := get(t, port); err == nil {
			t.Error("port still answers after its Service went")
		}
	})
}

func TestClose(t *testing.T) {
	s := New(Config{Addresses: loopback})
	port := freePort(t)
	if err := s.Sync(map[ServiceName]Service{{"ns", "a"}: {Port: port, LocalEndpoints: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := get(t, port); err == nil {
		t.Error("port answers after Close")
	}
	if err := s.Sync(nil); err == nil {
		t.Error("Sync after Close succeeded")
	}
}
