package daemon

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/svcproxy/svcproxy/internal/httpserver"
)

// httpServers are the metrics and health servers. Their listening sockets
// are handed over on a restart like the data path's, so a successor serves
// on the same ports without a gap.
type httpServers struct {
	log       *zap.Logger
	inherited map[string]*os.File
	servers   []*httpserver.Server
	lns       map[string]*net.TCPListener
}

// serve serves handler on addr (empty: off), on the inherited socket when a
// predecessor handed one over.
func (w *httpServers) serve(name, addr string, handler http.Handler) {
	if addr == "" {
		return
	}
	key := "http/" + name
	var ln net.Listener
	var err error
	if file := w.inherited[key]; file != nil {
		ln, err = net.FileListener(file)
		file.Close()
		delete(w.inherited, key)
	} else {
		ln, err = net.Listen("tcp", addr)
	}
	if err != nil {
		w.log.Error("http server failed", zap.String("server", name), zap.String("address", addr), zap.Error(err))
		return
	}
	if w.lns == nil {
		w.lns = map[string]*net.TCPListener{}
	}
	w.lns[key] = ln.(*net.TCPListener)
	w.servers = append(w.servers, httpserver.Serve(ln, handler, func(err error) {
		w.log.Error("http server failed", zap.String("server", name), zap.String("address", addr), zap.Error(err))
	}))
}

// sockets adds duplicates of the servers' listening sockets to files.
func (w *httpServers) sockets(files map[string]*os.File) (map[string]*os.File, error) {
	if files == nil {
		files = map[string]*os.File{}
	}
	for key, ln := range w.lns {
		f, err := ln.File()
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, fmt.Errorf("duplicating %s: %w", key, err)
		}
		files[key] = f
	}
	return files, nil
}

// metricsHandler serves the metrics address as kube-proxy does: /metrics,
// /proxyMode (the mode running, in plain text, e.g. "iptables") and
// /healthz ("ok": the server is up; the proxy's health is on the healthz
// address).
func metricsHandler(g prometheus.Gatherer, mode string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = io.WriteString(w, mode)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = io.WriteString(w, "ok")
	})
	return mux
}

// profilingHandler serves Go's profiles (only ever on loopback: the flag
// refuses other addresses).
func profilingHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// shutdown stops the servers, answering every request they accepted (a
// scrape or probe that raced a successor for the accept must not fail).
func (w *httpServers) shutdown(ctx context.Context) {
	httpserver.Stop(ctx, w.servers...)
}
