// Command svcproxy-backend is a small real backend for svcproxy's sandbox,
// end-to-end tests and benchmarks: an HTTP server that names itself, a TCP
// echo server and a UDP echo server, each optional.
//
//	GET /          → "<name>\n"
//	GET /bytes?n=N → N bytes (a bulk download)
//	POST /         → the request body, echoed
//
// The TCP echo server writes "<name>\n" first, then echoes until EOF; the
// UDP one answers every datagram with "<name> " followed by the datagram.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	name := flag.String("name", hostname(), "name this backend answers with")
	httpAddr := flag.String("http", "", "HTTP listen address, e.g. :8080; empty: off")
	echoAddr := flag.String("echo", "", "TCP echo listen address; empty: off")
	udpAddr := flag.String("udp", "", "UDP echo listen address; empty: off")
	flag.Parse()
	if *httpAddr == "" && *echoAddr == "" && *udpAddr == "" {
		fmt.Fprintln(os.Stderr, "svcproxy-backend: give at least one of --http, --echo, --udp")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	errc := make(chan error, 3)
	if *httpAddr != "" {
		srv := &http.Server{Addr: *httpAddr, Handler: handler(*name), ReadHeaderTimeout: 10 * time.Second}
		go func() { errc <- srv.ListenAndServe() }()
		go func() { <-ctx.Done(); _ = srv.Close() }()
	}
	if *echoAddr != "" {
		ln, err := net.Listen("tcp", *echoAddr)
		if err != nil {
			fail(err)
		}
		go func() { <-ctx.Done(); ln.Close() }()
		go func() { errc <- echoTCP(ln, *name) }()
	}
	if *udpAddr != "" {
		pc, err := net.ListenPacket("udp", *udpAddr)
		if err != nil {
			fail(err)
		}
		go func() { <-ctx.Done(); pc.Close() }()
		go func() { errc <- echoUDP(pc, *name) }()
	}
	fmt.Printf("svcproxy-backend %s ready\n", *name)
	select {
	case <-ctx.Done():
	case err := <-errc:
		if err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			fail(err)
		}
	}
}

func handler(name string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, name)
	})
	mux.HandleFunc("POST /{$}", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(w, r.Body)
	})
	zeros := make([]byte, 64<<10)
	mux.HandleFunc("GET /bytes", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "want /bytes?n=<count>", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		for n > 0 {
			k := min(n, int64(len(zeros)))
			if _, err := w.Write(zeros[:k]); err != nil {
				return
			}
			n -= k
		}
	})
	return mux
}

func echoTCP(ln net.Listener, name string) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			if _, err := io.WriteString(c, name+"\n"); err != nil {
				return
			}
			_, _ = io.Copy(c, c)
		}()
	}
}

func echoUDP(pc net.PacketConn, name string) error {
	buf := make([]byte, 64<<10)
	prefix := []byte(name + " ")
	for {
		n, from, err := pc.ReadFrom(buf[len(prefix):])
		if err != nil {
			return err
		}
		copy(buf, prefix)
		if _, err := pc.WriteTo(buf[:len(prefix)+n], from); err != nil {
			fmt.Fprintln(os.Stderr, "svcproxy-backend: udp reply:", err)
		}
	}
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "svcproxy-backend:", err)
	os.Exit(1)
}
