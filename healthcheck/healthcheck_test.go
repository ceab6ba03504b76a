package healthcheck

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/svcproxy/svcproxy/lb"
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

// applied returns a snapshot of a Store on node-a holding, for each of
// services, a LoadBalancer Service port with that health-check node port
// and that many ready endpoints on node-a, beside one ready endpoint on
// node-b and one terminating on node-a, which count for nothing.
func applied(t *testing.T, services map[ServiceName]Service) *lb.Snapshot {
	t.Helper()
	var ports []lb.Service
	i := 0
	for name, svc := range services {
		i++
		p := lb.Service{
			Name:                  lb.ServicePortName{Namespace: name.Namespace, Name: name.Name, Port: "http"},
			Port:                  80,
			ClusterIPs:            []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(i)})},
			HealthCheckNodePort:   svc.Port,
			ExternalTrafficPolicy: lb.PolicyLocal,
		}
		ep := func(j int, node string, ready bool) lb.Endpoint {
			return lb.Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i), byte(j)}), 8080),
				Ready: ready, Serving: true, Terminating: !ready, NodeName: node}
		}
		p.Endpoints = append(p.Endpoints, ep(200, "node-b", true), ep(201, "node-a", false))
		for j := range svc.LocalEndpoints {
			p.Endpoints = append(p.Endpoints, ep(j+1, "node-a", true))
		}
		ports = append(ports, p)
	}
	snap, err := lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: "node-a"}}).Replace(ports)
	if err != nil {
		t.Fatal(err)
	}
	return snap
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

	if err := s.Sync(applied(t, map[ServiceName]Service{web: {Port: port}})); err != nil {
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
			if err := s.Sync(applied(t, map[ServiceName]Service{web: {Port: port, LocalEndpoints: tc.endpoints}})); err != nil {
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
		if err := s.Sync(applied(t, map[ServiceName]Service{web: {Port: port2, LocalEndpoints: 1}})); err != nil {
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
		err = s.Sync(applied(t, map[ServiceName]Service{
			web:   {Port: port, LocalEndpoints: 1},
			other: {Port: uint16(busy.Addr().(*net.TCPAddr).Port), LocalEndpoints: 1},
		}))
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
		if err := s.Sync(applied(t, nil)); err != nil {
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
	if err := s.Sync(applied(t, map[ServiceName]Service{{"ns", "a"}: {Port: port, LocalEndpoints: 1}})); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := get(t, port); err == nil {
		t.Error("port answers after Close")
	}
	if err := s.Sync(applied(t, nil)); err == nil {
		t.Error("Sync after Close succeeded")
	}
}

// TestFromSnapshot: what the server serves is read from the applied
// snapshot, per Service (not per port), with kube-proxy's local endpoint
// count.
func TestFromSnapshot(t *testing.T) {
	ep := func(addr, node string, ready bool) lb.Endpoint {
		return lb.Endpoint{Addr: netip.MustParseAddrPort(addr), Ready: ready, Serving: true, Terminating: !ready, NodeName: node}
	}
	port := func(svc, name string, number uint16, hc uint16, eps ...lb.Endpoint) lb.Service {
		return lb.Service{Name: lb.ServicePortName{Namespace: "ns", Name: svc, Port: name}, Port: number,
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")}, HealthCheckNodePort: hc, Endpoints: eps}
	}
	web := []lb.Service{
		port("web", "http", 80, 32000, ep("10.1.0.1:80", "node-a", true), ep("10.1.0.2:80", "node-b", true), ep("10.1.0.3:80", "node-a", false)),
		port("web", "https", 443, 32000, ep("10.1.0.1:443", "node-a", true), ep("10.1.0.4:443", "node-a", true)),
	}
	for _, tc := range []struct {
		name     string
		node     string
		services []lb.Service
		want     map[ServiceName]Service
	}{
		{
			name:     "one address on two ports counts once; terminating and other nodes' do not count",
			node:     "node-a",
			services: web,
			want:     map[ServiceName]Service{{"ns", "web"}: {Port: 32000, LocalEndpoints: 2}},
		},
		{
			name:     "no node name: no local endpoints",
			services: web,
			want:     map[ServiceName]Service{{"ns", "web"}: {Port: 32000, LocalEndpoints: 0}},
		},
		{
			name:     "no health-check node port: not served",
			node:     "node-a",
			services: []lb.Service{port("db", "", 5432, 0, ep("10.1.0.9:5432", "node-a", true))},
			want:     map[ServiceName]Service{},
		},
		{
			name: "each Service counts its own endpoints",
			node: "node-a",
			services: append([]lb.Service{
				port("api", "", 8080, 32001, ep("10.1.0.1:8080", "node-a", true)),
			}, web...),
			want: map[ServiceName]Service{
				{"ns", "api"}: {Port: 32001, LocalEndpoints: 1},
				{"ns", "web"}: {Port: 32000, LocalEndpoints: 2},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range tc.services { // one ClusterIP each
				tc.services[i].ClusterIPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)})}
			}
			snap, err := lb.NewStore(lb.StoreOptions{Node: lb.Node{Name: tc.node}}).Replace(tc.services)
			if err != nil {
				t.Fatal(err)
			}
			if got := FromSnapshot(snap); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("FromSnapshot = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestSyncFollowsSnapshots: the server opens, updates and closes health
// checks as applied snapshots add, change and remove Services.
func TestSyncFollowsSnapshots(t *testing.T) {
	s := New(Config{Addresses: loopback})
	defer s.Close()
	web := ServiceName{"ns", "web"}
	port := freePort(t)
	for _, step := range []struct {
		name      string
		services  map[ServiceName]Service
		code      int // 0: the port is closed
		endpoints int
	}{
		{"added without local endpoints", map[ServiceName]Service{web: {Port: port}}, http.StatusServiceUnavailable, 0},
		{"local endpoints appear", map[ServiceName]Service{web: {Port: port, LocalEndpoints: 3}}, http.StatusOK, 3},
		{"removed", nil, 0, 0},
	} {
		if err := s.Sync(applied(t, step.services)); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		r, err := get(t, port)
		switch {
		case step.code == 0 && err == nil:
			t.Errorf("%s: the port still answers", step.name)
		case step.code != 0 && err != nil:
			t.Errorf("%s: %v", step.name, err)
		case step.code != 0 && (r.code != step.code || r.body.LocalEndpoints != step.endpoints):
			t.Errorf("%s: %d with %d local endpoints, want %d with %d", step.name, r.code, r.body.LocalEndpoints, step.code, step.endpoints)
		}
		if got, want := s.Services(), FromSnapshot(applied(t, step.services)); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: serving %v, want %v", step.name, got, want)
		}
	}
}

// TestHandover: a successor serves the health checks on the sockets its
// predecessor handed over, where binding the ports anew would fail while
// the predecessor holds them, and closes those no Service uses; the
// predecessor, handed over, serves no more and its Syncs do nothing.
func TestHandover(t *testing.T) {
	web, gone := ServiceName{"ns", "web"}, ServiceName{"ns", "gone"}
	port, gonePort := freePort(t), freePort(t)
	both := map[ServiceName]Service{web: {Port: port, LocalEndpoints: 1}, gone: {Port: gonePort, LocalEndpoints: 1}}
	old := New(Config{Addresses: loopback})
	defer old.Close()
	if err := old.Sync(applied(t, both)); err != nil {
		t.Fatal(err)
	}
	if g := old.Generation(); g != 2 {
		t.Errorf("Generation() = %d after opening two, want 2", g)
	}
	files, err := old.Sockets()
	if err != nil {
		t.Fatal(err)
	}
	names := slices.Sorted(maps.Keys(files))
	want := []string{fmt.Sprintf("%s127.0.0.1:%d", SocketPrefix, port), fmt.Sprintf("%s127.0.0.1:%d", SocketPrefix, gonePort)}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("Sockets() named %q, want %q", names, want)
	}

	succ := New(Config{Addresses: loopback})
	defer succ.Close()
	succ.Inherit(files)
	if err := succ.Sync(applied(t, map[ServiceName]Service{web: {Port: port, LocalEndpoints: 2}})); err != nil {
		t.Fatalf("the successor's Sync, with the predecessor still serving: %v", err)
	}
	old.HandOver()
	if r, err := get(t, port); err != nil || r.body.LocalEndpoints != 2 {
		t.Errorf("web after the handover: %+v, %v; want the successor's answer (2 local endpoints)", r, err)
	}
	if err := old.Sync(applied(t, both)); err != nil {
		t.Errorf("Sync after HandOver: %v, want nil (nothing to do)", err)
	}
	if got := old.Services(); len(got) != 0 {
		t.Errorf("the predecessor serves %v after handing over, want nothing", got)
	}
	// Neither holds the port of the Service gone any more.
	if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", gonePort)); err != nil {
		t.Errorf("the port of the Service gone is still held (its handed-over socket not closed): %v", err)
	} else {
		ln.Close()
	}
}

// TestHandOverAnswersWhatItAccepted: a probe the predecessor accepted just
// before handing over (it raced the successor for the accept) is answered,
// even when its request arrives after HandOver began; an http.Server
// shutting down would drop it, and the load balancer would count a failed
// check.
func TestHandOverAnswersWhatItAccepted(t *testing.T) {
	web := ServiceName{"ns", "web"}
	port := freePort(t)
	old := New(Config{Addresses: loopback})
	defer old.Close()
	if err := old.Sync(applied(t, map[ServiceName]Service{web: {Port: port, LocalEndpoints: 1}})); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Accepted once the server tracks it; no request yet.
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(time.Millisecond) {
		old.mu.Lock()
		accepted := old.services[web].servers[0].Pending() > 0
		old.mu.Unlock()
		if accepted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the connection was not accepted")
		}
	}
	handedOver := make(chan struct{})
	go func() { old.HandOver(); close(handedOver) }()
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) { // HandOver is under way: the listener closed
		c2, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err != nil {
			break
		}
		c2.Close()
		if time.Now().After(deadline) {
			t.Fatal("the listener still accepts during HandOver")
		}
	}
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("the probe accepted before the handover: %v, want its answer", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the probe accepted before the handover: %s, want 200", resp.Status)
	}
	<-handedOver
}
