// Package healthcheck owns the health-check node ports of LoadBalancer
// Services with externalTrafficPolicy: Local, with kube-proxy's semantics:
// one HTTP server per Service on its spec.healthCheckNodePort answers 200
// while this node has ready endpoints of the Service and the proxy itself is
// healthy, and 503 otherwise, so the cloud load balancer sends traffic only
// to nodes that can serve it locally. The body is kube-proxy's:
//
//	{"service":{"namespace":"ns","name":"web"},"localEndpoints":2,"serviceProxyHealthy":true}
//
// The server follows the snapshots the proxy has applied (Server.Sync after
// each successful sync), not the source: a port opens, and a count changes,
// once the rules serving it are in place. On a restart its listening
// sockets pass to the successor with the proxy's (Sockets, Inherit,
// HandOver): the successor could not bind the ports while this process
// holds them.
package healthcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/internal/httpserver"
	"github.com/svcproxy/svcproxy/lb"
)

// ServiceName names a Service (not one of its ports).
type ServiceName struct {
	Namespace string
	Name      string
}

func (n ServiceName) String() string { return n.Namespace + "/" + n.Name }

// Service is what the server needs of one Service.
type Service struct {
	Port           uint16 // the health-check node port
	LocalEndpoints int    // distinct ready endpoint addresses on this node
}

// Config configures a Server. The zero value serves on every address.
type Config struct {
	// Addresses to listen on, each with every Service's port; nil: the
	// unspecified address (every node address of both families).
	Addresses []netip.Addr
	// Healthy reports the proxy's own health (what /healthz says); nil:
	// always healthy.
	Healthy func() bool
	// Listen opens a listener; nil: net.ListenConfig.Listen.
	Listen func(ctx context.Context, network, addr string) (net.Listener, error)
	Logger *zap.Logger // nil: no logging
}

// Server serves the health-check node ports. Use New; call Close when done.
type Server struct {
	cfg Config
	log *zap.Logger

	mu         sync.Mutex
	services   map[ServiceName]*instance
	inherited  map[string]*os.File // a predecessor's sockets, until the next Sync
	gen        uint64              // counts listeners opened and closed
	closed     bool
	handedOver bool
}

type instance struct {
	port      uint16
	endpoints int
	servers   []*httpserver.Server
	lns       map[string]net.Listener // by socket name (SocketPrefix + address)
}

// SocketPrefix begins the names of the health checks' listening sockets in
// a handover (Sockets, Inherit): "healthcheck/" and the address listened
// on, ":30000" or "10.0.0.1:30000".
const SocketPrefix = "healthcheck/"

// New returns a Server that serves nothing until Sync.
func New(cfg Config) *Server {
	if cfg.Listen == nil {
		var lc net.ListenConfig
		cfg.Listen = lc.Listen
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	return &Server{cfg: cfg, log: log.Named("healthcheck"), services: map[ServiceName]*instance{}}
}

// Sync makes the server serve what snap, an applied snapshot, asks for
// (see FromSnapshot): a listener opens for each new Service (or changed
// port), closes for each one gone, and the local endpoint counts are
// updated. A port that cannot be opened is logged and returned in the
// error; the other Services are still served, and the next Sync tries it
// again. A port a predecessor handed over (Inherit) is served on its
// socket. Once handed over itself (HandOver), Sync does nothing.
func (s *Server) Sync(snap *lb.Snapshot) error { return s.sync(FromSnapshot(snap)) }

// FromSnapshot returns every Service of snap with a health-check node port,
// with its local endpoint count: the distinct addresses of ready endpoints
// on snap's node across all the Service's ports (as kube-proxy: 10.0.0.1:80
// and 10.0.0.1:443 are one endpoint; none without a node name).
func FromSnapshot(snap *lb.Snapshot) map[ServiceName]Service {
	out := map[ServiceName]Service{}
	node := snap.Node.Name
	var name ServiceName
	var local map[netip.Addr]struct{}
	for _, b := range snap.Balancers() { // sorted: a Service's ports are adjacent
		svc := b.Service
		if svc.HealthCheckNodePort == 0 {
			continue
		}
		if n := (ServiceName{svc.Name.Namespace, svc.Name.Name}); n != name || local == nil {
			name, local = n, map[netip.Addr]struct{}{}
		}
		for _, ep := range svc.Endpoints {
			if ep.Ready && node != "" && ep.NodeName == node {
				local[ep.Addr.Addr()] = struct{}{}
			}
		}
		out[name] = Service{Port: svc.HealthCheckNodePort, LocalEndpoints: len(local)}
	}
	return out
}

func (s *Server) sync(services map[ServiceName]Service) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.handedOver {
		return nil // a successor serves them
	}
	if s.closed {
		return errors.New("healthcheck: server closed")
	}
	defer s.closeInherited()
	for name, inst := range s.services {
		if svc, ok := services[name]; !ok || svc.Port != inst.port {
			s.log.Info("closing health check", zap.Stringer("service", name), zap.Uint16("port", inst.port))
			inst.close()
			delete(s.services, name)
			s.gen++
		}
	}
	var errs []error
	for name, svc := range services {
		if inst := s.services[name]; inst != nil {
			inst.endpoints = svc.LocalEndpoints
			continue
		}
		if svc.Port == 0 {
			continue
		}
		inst := &instance{port: svc.Port, endpoints: svc.LocalEndpoints}
		if err := s.open(name, inst); err != nil {
			s.log.Error("opening health check", zap.Stringer("service", name), zap.Uint16("port", svc.Port), zap.Error(err))
			errs = append(errs, fmt.Errorf("service %v: %w", name, err))
			continue
		}
		s.log.Info("opened health check", zap.Stringer("service", name), zap.Uint16("port", svc.Port))
		s.services[name] = inst
		s.gen++
	}
	return errors.Join(errs...)
}

// closeInherited closes the predecessor's sockets that the Sync just done
// did not take: their Services are gone (or moved to another port).
func (s *Server) closeInherited() {
	for name, f := range s.inherited {
		s.log.Info("closing a handed-over health check socket no Service uses", zap.String("socket", name))
		f.Close()
	}
	s.inherited = nil
}

// Inherit gives the server a predecessor's listening sockets, named with
// SocketPrefix (the server owns files now, and closes any other): the
// next Sync serves each Service's health check on the socket handed over
// for its address, when there is one, rather than binding the port anew,
// which would fail while the predecessor still holds it; it closes the
// sockets no Service uses.
func (s *Server) Inherit(files map[string]*os.File) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeInherited()
	s.inherited = map[string]*os.File{}
	for name, f := range files {
		if strings.HasPrefix(name, SocketPrefix) {
			s.inherited[name] = f
		} else {
			f.Close()
		}
	}
}

// Sockets returns duplicates of the listening sockets, named with
// SocketPrefix, for a successor process (Inherit); the caller closes them.
func (s *Server) Sockets() (map[string]*os.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	files := map[string]*os.File{}
	for _, inst := range s.services {
		for name, ln := range inst.lns {
			fl, ok := ln.(interface{ File() (*os.File, error) })
			if !ok {
				continue // not a socket (Config.Listen's in tests)
			}
			f, err := fl.File()
			if err != nil {
				for _, f := range files {
					f.Close()
				}
				return nil, fmt.Errorf("duplicating %s: %w", name, err)
			}
			files[name] = f
		}
	}
	return files, nil
}

// Generation counts the listeners opened and closed: when it has not
// changed, neither has what Sockets returns.
func (s *Server) Generation() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

// HandOver stops serving: a successor took the sockets (Sockets) and serves
// the health checks now. The listeners close here (the successor holds its
// own copies, so the ports stay open), and later Syncs do nothing. Every
// probe this process accepted is answered (within a second; see
// httpserver): one that raced the successor for the accept must not fail.
func (s *Server) HandOver() {
	s.mu.Lock()
	var servers []*httpserver.Server
	for _, inst := range s.services { // kept: requests being answered read their counts
		servers = append(servers, inst.servers...)
		inst.servers, inst.lns = nil, nil
	}
	s.handedOver = true
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	httpserver.Stop(ctx, servers...)
}

func (s *Server) open(name ServiceName, inst *instance) error {
	addrs := []string{":" + strconv.Itoa(int(inst.port))} // every address, both families where the node has them
	if len(s.cfg.Addresses) > 0 {
		addrs = addrs[:0]
		for _, ip := range s.cfg.Addresses {
			addrs = append(addrs, netip.AddrPortFrom(ip, inst.port).String())
		}
	}
	for _, addr := range addrs {
		key := SocketPrefix + addr
		var ln net.Listener
		var err error
		if f := s.inherited[key]; f != nil {
			ln, err = net.FileListener(f)
			f.Close()
			delete(s.inherited, key)
		} else {
			ln, err = s.cfg.Listen(context.Background(), "tcp", addr)
		}
		if err != nil {
			inst.close()
			return fmt.Errorf("listening on %s: %w", addr, err)
		}
		inst.servers = append(inst.servers, httpserver.Serve(ln, s.handler(name), func(err error) {
			s.log.Warn("health check server stopped", zap.Stringer("service", name), zap.String("address", addr), zap.Error(err))
		}))
		if inst.lns == nil {
			inst.lns = map[string]net.Listener{}
		}
		inst.lns[key] = ln
	}
	return nil
}

func (inst *instance) close() {
	for _, sv := range inst.servers {
		_ = sv.Close()
	}
	inst.servers, inst.lns = nil, nil
}

// Services returns the Services being served, for tests and debugging:
// none once handed over.
func (s *Server) Services() map[ServiceName]Service {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.handedOver {
		return nil
	}
	out := make(map[ServiceName]Service, len(s.services))
	for name, inst := range s.services {
		out[name] = Service{Port: inst.port, LocalEndpoints: inst.endpoints}
	}
	return out
}

// Close stops every listener. The Server cannot be used afterwards.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, inst := range s.services {
		inst.close()
	}
	clear(s.services)
	s.closeInherited()
	s.closed = true
	return nil
}

// status is kube-proxy's response body.
type status struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// Handler returns the handler for name's health check (every path).
func (s *Server) Handler(name ServiceName) http.Handler { return s.handler(name) }

func (s *Server) handler(name ServiceName) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		inst := s.services[name]
		count := 0
		if inst != nil {
			count = inst.endpoints
		}
		s.mu.Unlock()
		healthy := s.cfg.Healthy == nil || s.cfg.Healthy()

		var st status
		st.Service.Namespace, st.Service.Name = name.Namespace, name.Name
		st.LocalEndpoints, st.ServiceProxyHealthy = count, healthy
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
		if count > 0 && healthy {
			w.WriteHeader(http.StatusOK)
		} else {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(st)
	})
}
